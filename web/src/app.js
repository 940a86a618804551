// The page body: workspace picker, live file tree, file view, diff view, turn history and a
// terminal. `mountShellPage(el, host)` builds it inside `el` and returns its teardown.
import { h, clear, errorText, base64ToBytes, debounce } from "./dom.js";
import { isNoise, join, relative, imageType, language } from "./paths.js";
import { highlight } from "./highlight.js";
import { fullTime, shortTime } from "./times.js";
import { renderDiff } from "./diffview.js";
import { createTerminalPane } from "./terminal.js";

// The pane's state key in shell::ui-state.
const STATE_KEY = "shell:explorer";
// Reads through coder::read-file up to this size; above it (and for images) in chunks.
const TEXT_LIMIT = 1024 * 1024;
const CHUNK = 1024 * 1024;
// Most read in chunks for one view.
const CHUNKED_LIMIT = 16 * 1024 * 1024;
// Bodies larger than this (old + new) are not diffed in the page.
const DIFF_LIMIT = 2 * 1024 * 1024;
// Most baselines the page keeps (the oldest are forgotten first).
const SEEN_LIMIT = 256;
// Sessions asked for at a time (shell::turns::sessions takes at most 200 per call).
const SESSIONS_PAGE = 20;
const SESSIONS_MAX = 200;

export function mountShellPage(el, host) {
  const call = (fid, payload) => host.iii.trigger(fid, payload);
  const browserId = host.iii.browserId;
  const cleanups = [];
  let state = { root: null, open: null, session_id: "", terminal: null };
  let unbindChanged = null;
  const expanded = new Set();
  const lastSeen = new Map(); // path -> text the page last saw (the diff baseline), newest last
  const remember = (path, text) => {
    lastSeen.delete(path);
    if (typeof text !== "string" || text.length > DIFF_LIMIT) return;
    lastSeen.set(path, text);
    while (lastSeen.size > SEEN_LIMIT) lastSeen.delete(lastSeen.keys().next().value);
  };
  let openPath = null;

  const saveState = debounce(() => {
    call("shell::ui-state::set", { key: STATE_KEY, state }).catch((e) => console.warn("ui-state::set", e));
  }, 200);
  const update = (patch) => {
    state = { ...state, ...patch };
    saveState();
  };

  // ---- layout
  const wsInput = h("input", { class: "shell-ws-input", "data-testid": "ws-input", placeholder: "/path/to/workspace", spellcheck: "false" });
  const wsChoices = h("div", { class: "shell-ws-choices", "data-testid": "ws-choices" });
  const wsCurrent = h("code", { "data-testid": "ws-current", text: "no workspace" });
  const wsError = h("span", { class: "shell-error", "data-testid": "ws-error" });
  const tree = h("div", { class: "shell-tree", "data-testid": "tree" });
  const fileView = h("section", { class: "shell-file", "data-testid": "file-view" }, h("div", { class: "shell-muted", text: "open a file from the tree" }));
  const diffView = h("section", { class: "shell-diff", "data-testid": "diff-view" }, h("div", { class: "shell-muted", text: "the last written file shows here as a diff" }));
  const sessionInput = h("input", { class: "shell-session-input", "data-testid": "turns-session", placeholder: "or type a session id", spellcheck: "false" });
  const sessionsList = h("div", { class: "shell-sessions", "data-testid": "turns-sessions" });
  const sessionsMore = h("button", { class: "shell-small", "data-testid": "turns-sessions-more", hidden: true, onclick: () => moreSessions() }, "older sessions");
  const turnsCurrent = h("div", { class: "shell-subtitle", "data-testid": "turns-current", text: "no session open" });
  const turnsList = h("div", { class: "shell-turns-list", "data-testid": "turns-list" });
  const revertNote = h("div", { class: "shell-muted", "data-testid": "revert-result" });
  const termEl = h("section", { class: "shell-term" });

  el.append(
    h(
      "div",
      { class: "shell-root" },
      h(
        "header",
        { class: "shell-top" },
        h("strong", { text: "Workspace" }),
        wsInput,
        h("button", { "data-testid": "ws-browse", onclick: () => browse(wsInput.value) }, "Browse"),
        h("button", { "data-testid": "ws-open", onclick: () => pick(wsInput.value) }, "Open"),
        wsCurrent,
        wsError,
      ),
      wsChoices,
      h(
        "div",
        { class: "shell-body" },
        h("aside", { class: "shell-side" }, h("div", { class: "shell-pane-title", text: "Files" }), tree),
        h("div", { class: "shell-main" }, fileView, diffView),
        h(
          "aside",
          { class: "shell-turns" },
          h("div", { class: "shell-pane-title", text: "Turns" }),
          h("div", { class: "shell-subtitle", text: "Sessions" }),
          sessionsList,
          sessionsMore,
          h("div", { class: "shell-row" }, sessionInput, h("button", { "data-testid": "turns-load", onclick: () => openSession(sessionInput.value.trim()) }, "Load")),
          turnsCurrent,
          revertNote,
          turnsList,
        ),
      ),
      termEl,
    ),
  );

  // ---- workspace picker (shell::workspace::*)
  async function showRoots() {
    try {
      const { roots } = await call("shell::workspace::roots", {});
      clear(wsChoices);
      for (const r of roots) wsChoices.append(h("button", { class: "shell-chip", "data-testid": "ws-root", onclick: () => browse(r) }, r));
    } catch (e) {
      wsError.textContent = `roots: ${errorText(e)}`;
    }
  }

  async function browse(path) {
    wsError.textContent = "";
    if (!path) return showRoots();
    try {
      const { path: dir, entries } = await call("shell::workspace::list", { path });
      wsInput.value = dir;
      clear(wsChoices);
      wsChoices.append(h("button", { class: "shell-chip", "data-testid": "ws-pick", onclick: () => pick(dir) }, `Open ${dir}`));
      for (const e of entries) wsChoices.append(h("button", { class: "shell-chip", "data-testid": "ws-child", onclick: () => browse(e.path) }, `${e.name}/`));
    } catch (e) {
      wsError.textContent = errorText(e);
    }
  }

  async function pick(path) {
    wsError.textContent = "";
    try {
      const { path: root } = await call("shell::workspace::validate", { path });
      wsInput.value = root;
      clear(wsChoices);
      setRoot(root);
    } catch (e) {
      wsError.textContent = errorText(e);
    }
  }

  function setRoot(root) {
    state.root = root;
    update({ root });
    wsCurrent.textContent = root;
    expanded.clear();
    bindChanges(root);
    refreshTree();
  }

  // ---- live tree (shell::changed with include_ignored)
  const changedFn = "iii::shell-ui::changed";
  const changedFid = `${changedFn}::${browserId}`;
  let lastWritten = null;
  const refreshTreeSoon = debounce(() => refreshTree(), 60);
  const refreshTurnsSoon = debounce(() => refreshTurns(), 250);
  const refreshSessionsSoon = debounce(() => refreshSessions(), 250);
  cleanups.push(
    host.iii.on(changedFn, (ev) => {
      if (!state.root || !ev || ev.root !== state.root) return;
      refreshTreeSoon();
      refreshTurnsSoon();
      refreshSessionsSoon();
      if (ev.overflow || ev.dir || !ev.path || ev.path === ".") return;
      // Change paths are relative to the watched root.
      const path = join(ev.root, ev.path);
      if (path === openPath) {
        if (ev.kind === "deleted") showFile(path, { missing: true });
        else showFile(path);
      }
      if (ev.kind !== "deleted" && !isNoise(state.root, path)) {
        lastWritten = path;
        showDiffFor(path, ev.kind);
      }
    }),
  );

  function bindChanges(root) {
    if (unbindChanged) unbindChanged();
    unbindChanged = host.iii.registerTrigger({ type: "shell::changed", function_id: changedFid, config: { path: root, include_ignored: true } });
  }
  cleanups.push(() => unbindChanged && unbindChanged());

  async function listDir(dir) {
    const out = [];
    for (let page = 1; page < 50; page++) {
      const r = await call("coder::list-folder", { path: dir, page, page_size: 500 });
      out.push(...r.entries);
      if (!r.has_more) break;
    }
    out.sort((a, b) => (a.kind === "dir") !== (b.kind === "dir") ? (a.kind === "dir" ? -1 : 1) : a.name.localeCompare(b.name));
    return out;
  }

  let treeGen = 0;
  async function refreshTree() {
    const root = state.root;
    if (!root) return;
    const gen = ++treeGen;
    const list = h("ul", { class: "shell-tree-list" });
    try {
      await fillDir(list, root, 0);
    } catch (e) {
      list.append(h("li", { class: "shell-error", text: errorText(e) }));
    }
    if (gen !== treeGen) return;
    clear(tree);
    tree.append(list);
  }

  async function fillDir(ul, dir, depth) {
    const entries = await listDir(dir);
    for (const e of entries) {
      const path = join(dir, e.name);
      const isDir = e.kind === "dir";
      const label = h(
        "div",
        {
          class: `shell-tree-entry${isDir ? " shell-tree-dir" : ""}${path === openPath ? " shell-selected" : ""}`,
          "data-path": path,
          "data-testid": "tree-entry",
          style: `padding-left:${depth * 12 + 4}px`,
          onclick: () => {
            if (isDir) {
              if (expanded.has(path)) expanded.delete(path);
              else expanded.add(path);
              refreshTree();
            } else {
              showFile(path, { size: e.size });
            }
          },
        },
        `${isDir ? (expanded.has(path) ? "▾ " : "▸ ") : ""}${e.name}`,
      );
      const li = h("li", {}, label);
      ul.append(li);
      if (isDir && expanded.has(path) && depth < 32) {
        const sub = h("ul", { class: "shell-tree-list" });
        li.append(sub);
        await fillDir(sub, path, depth + 1);
      }
    }
  }

  // ---- file view (coder::read-file; large files and images through workspace::read-bytes)
  async function readChunks(path, limit) {
    const parts = [];
    let offset = 0;
    let size = 0;
    for (;;) {
      const r = await call("shell::workspace::read-bytes", { path, offset, length: CHUNK });
      const bytes = base64ToBytes(r.content);
      parts.push(bytes);
      offset += bytes.length;
      size = r.size;
      if (r.eof || bytes.length === 0 || offset >= limit) break;
    }
    return { parts, read: offset, size };
  }

  let fileGen = 0;
  async function showFile(path, opts = {}) {
    const gen = ++fileGen;
    if (openPath !== path) update({ open: path });
    openPath = path;
    const title = h("div", { class: "shell-pane-title" }, h("code", { "data-testid": "file-path", text: relative(state.root || "", path) ?? path }));
    const body = h("div", { class: "shell-file-body" });
    const render = () => {
      if (gen !== fileGen) return;
      clear(fileView);
      fileView.append(title, body);
    };
    if (opts.missing) {
      body.append(h("div", { class: "shell-muted", text: "deleted" }));
      return render();
    }
    try {
      const img = imageType(path);
      if (img || (opts.size ?? 0) > TEXT_LIMIT) {
        const { parts, read, size } = await readChunks(path, CHUNKED_LIMIT);
        if (img) {
          const url = URL.createObjectURL(new Blob(parts, { type: img }));
          body.append(h("img", { class: "shell-image", src: url, "data-testid": "file-image", alt: path }));
        } else {
          const text = new TextDecoder().decode(concat(parts));
          body.append(h("div", { class: "shell-muted", text: `showing ${read} of ${size} bytes (read in ${parts.length} chunks)` }));
          body.append(h("pre", { class: "shell-code" }, h("code", { "data-testid": "file-content", text })));
        }
        return render();
      }
      const r = await call("coder::read-file", { path });
      if (r.is_utf8 === false) {
        body.append(h("div", { class: "shell-muted", text: `binary file, ${r.size ?? "?"} bytes` }));
        return render();
      }
      const text = r.content ?? "";
      // The diff view owns the baseline once it has one (it moves it on every change it shows).
      if (!lastSeen.has(path)) remember(path, text);
      const code = h("code", { class: "hljs", "data-testid": "file-content" });
      code.innerHTML = highlight(text, language(path));
      body.append(h("pre", { class: "shell-code" }, code));
      render();
    } catch (e) {
      body.append(h("div", { class: "shell-error", text: errorText(e) }));
      render();
    }
  }

  // ---- diff of the last written file (coder::change-diff, else the last-seen body)
  let diffGen = 0;
  async function showDiffFor(path, kind) {
    const gen = ++diffGen;
    try {
      const r = await call("coder::read-file", { path });
      if (gen !== diffGen || lastWritten !== path) {
        // A later change took the view; this body is still the page's newest sight of the file.
        // (Not when the newer change is to this same file: its own diff needs the old baseline.)
        if (r.is_utf8 !== false && lastWritten !== path) remember(path, r.content ?? "");
        return;
      }
      let view = null;
      if (r.revision) {
        try {
          const d = await call("coder::change-diff", { change_id: r.revision });
          view = { path, oldText: d.old_contents, newText: d.new_contents, isBinary: d.is_binary, source: "coder::change-diff" };
        } catch {
          /* not a coder change: fall back to the page's baseline */
        }
      }
      if (!view) {
        // An atomic replace (rename over the file) reports `created`: a body the page has
        // seen is still the baseline; only a file it never saw diffs against nothing.
        const seen = lastSeen.has(path);
        const baseline = seen ? lastSeen.get(path) : "";
        // A second event for a write already shown (rename and close come apart): keep the
        // diff that shows the change rather than an empty one.
        if (seen && baseline === (r.content ?? "")) return;
        view = { path, oldText: baseline, newText: r.content ?? "", isBinary: r.is_utf8 === false, source: seen ? "since last seen" : kind === "created" ? "created" : "new to this page" };
      }
      if (gen !== diffGen) {
        // A later change took the view while this diff was fetched: as above, this body is
        // still the page's newest sight of the file, and the baseline of its next diff.
        if (!view.isBinary && lastWritten !== path) remember(path, view.newText ?? "");
        return;
      }
      if (!view.isBinary) remember(path, view.newText ?? "");
      if ((view.oldText ?? "").length + (view.newText ?? "").length > DIFF_LIMIT) {
        clear(diffView);
        diffView.append(h("div", { class: "shell-pane-title", text: `Diff ${relative(state.root || "", path) ?? path}` }), h("div", { class: "shell-muted", text: "too large to diff here" }));
        return;
      }
      renderDiff(diffView, { ...view, path: relative(state.root || "", path) ?? path });
    } catch {
      /* the file went away again */
    }
  }

  // ---- turn history (shell::turns::*)
  // The sessions with recorded turns, newest first (shell::turns::sessions); one click opens one.
  let sessionsGen = 0;
  let sessionsShown = [];
  let sessionsCursor = null;

  function openSession(id) {
    if (!id) return;
    sessionInput.value = id;
    update({ session_id: id });
    renderSessions();
    refreshTurns();
  }

  function sessionRow(s) {
    const n = s.turn_count;
    const selected = s.session_id === state.session_id;
    return h(
      "button",
      {
        class: `shell-session${selected ? " shell-selected" : ""}`,
        "data-testid": "turns-session-item",
        "data-session-id": s.session_id,
        title: `${s.session_id}\nfirst turn started ${fullTime(s.first_started_at)}\nlast turn started ${fullTime(s.last_started_at)}\nhistory changed ${fullTime(s.updated_at)}`,
        onclick: () => openSession(s.session_id),
      },
      h("span", { class: "shell-session-head" }, h("code", { class: "shell-session-id", text: s.session_id }), h("span", { class: "shell-muted", "data-testid": "session-turn-count", text: `${n} turn${n === 1 ? "" : "s"}` })),
      s.last_title ? h("span", { class: "shell-session-title", "data-testid": "session-title", text: s.last_title }) : null,
      h("span", { class: "shell-muted shell-session-times", "data-testid": "session-times", text: `${shortTime(s.updated_at)} · first ${shortTime(s.first_started_at)}` }),
    );
  }

  function renderSessions() {
    clear(sessionsList);
    if (!sessionsShown.length) sessionsList.append(h("div", { class: "shell-muted", text: "no session has recorded turns yet" }));
    for (const s of sessionsShown) sessionsList.append(sessionRow(s));
    sessionsMore.hidden = !sessionsCursor;
  }

  async function refreshSessions() {
    const gen = ++sessionsGen;
    try {
      // As many as are shown (older pages the user opened stay open), newest first.
      const limit = Math.min(SESSIONS_MAX, Math.max(SESSIONS_PAGE, sessionsShown.length));
      const r = await call("shell::turns::sessions", { limit });
      if (gen !== sessionsGen) return;
      sessionsShown = r.sessions || [];
      sessionsCursor = r.next_cursor ?? null;
      renderSessions();
    } catch (e) {
      if (gen !== sessionsGen) return;
      clear(sessionsList);
      sessionsList.append(h("div", { class: "shell-error", text: `sessions: ${errorText(e)}` }));
    }
  }

  async function moreSessions() {
    if (!sessionsCursor) return;
    const gen = ++sessionsGen;
    try {
      const r = await call("shell::turns::sessions", { limit: SESSIONS_PAGE, cursor: sessionsCursor });
      if (gen !== sessionsGen) return;
      // A session that changed meanwhile moved up and is already shown.
      const seen = new Set(sessionsShown.map((s) => s.session_id));
      sessionsShown = sessionsShown.concat((r.sessions || []).filter((s) => !seen.has(s.session_id)));
      sessionsCursor = r.next_cursor ?? null;
      renderSessions();
    } catch (e) {
      sessionsList.append(h("div", { class: "shell-error", text: `sessions: ${errorText(e)}` }));
    }
  }

  let turnsGen = 0;
  async function refreshTurns() {
    const sid = state.session_id;
    turnsCurrent.textContent = sid ? `Turns of ${sid}` : "no session open";
    if (!sid) return;
    const gen = ++turnsGen;
    try {
      const { turns } = await call("shell::turns::list", { session_id: sid });
      if (gen !== turnsGen) return;
      clear(turnsList);
      if (!turns.length) turnsList.append(h("div", { class: "shell-muted", text: "no turns recorded" }));
      for (const t of turns) {
        const files = h("ul", { class: "shell-turn-files" });
        for (const f of t.files || []) {
          files.append(
            h(
              "li",
              {},
              h("span", { class: `shell-kind-${f.kind}`, text: f.kind }),
              " ",
              h("code", { text: relative(state.root || "", f.path) ?? f.path }),
              " ",
              h("button", { class: "shell-small", "data-testid": "revert-file", onclick: () => revert(t.turn_id, [f.path]) }, "revert"),
            ),
          );
        }
        turnsList.append(
          h(
            "div",
            { class: "shell-turn", "data-testid": "turn", "data-turn-id": t.turn_id },
            h("div", { class: "shell-row" }, h("strong", { text: t.title || t.turn_id }), h("span", { class: "shell-muted", text: ` ${t.file_count ?? (t.files || []).length} file(s)` }), h("button", { "data-testid": "revert-turn", onclick: () => revert(t.turn_id, null) }, "Revert turn")),
            files,
          ),
        );
      }
    } catch (e) {
      clear(turnsList);
      turnsList.append(h("div", { class: "shell-error", text: errorText(e) }));
    }
  }

  async function revert(turnId, paths) {
    revertNote.textContent = "";
    const payload = { session_id: state.session_id, turn_id: turnId };
    if (paths) payload.paths = paths;
    try {
      const r = await call("shell::turns::revert", payload);
      revertNote.className = r.failed ? "shell-error" : "shell-muted";
      revertNote.textContent = `reverted ${r.reverted}, failed ${r.failed}${r.failed ? ": " + r.results.filter((x) => x.error).map((x) => x.error).join("; ") : ""}`;
      if (openPath) showFile(openPath);
      refreshTree();
      // The revert wrote these files: the last restored one becomes the diff, whether or not
      // the change feed reports it.
      const restored = (r.results || []).filter((x) => x.success && x.action === "restored" && !isNoise(state.root || "", x.path));
      if (restored.length) {
        const last = restored[restored.length - 1].path;
        lastWritten = last;
        showDiffFor(last, "modified");
      }
    } catch (e) {
      revertNote.className = "shell-error";
      revertNote.textContent = `revert failed: ${errorText(e)}`;
    }
  }

  // ---- terminal
  const outputFn = "iii::shell-ui::pty-output";
  const listeners = new Set();
  cleanups.push(host.iii.on(outputFn, (ev) => { for (const l of listeners) l(ev); }));
  let disposeTerminal = null;

  // ---- start: restore the pane's state, then the workspace
  (async () => {
    try {
      const got = await call("shell::ui-state::get", { key: STATE_KEY });
      if (got && got.state && typeof got.state === "object") state = { ...state, ...got.state };
    } catch (e) {
      console.warn("ui-state::get", e);
    }
    sessionInput.value = state.session_id || "";
    disposeTerminal = createTerminalPane(termEl, {
      call,
      outputFid: `${outputFn}::${browserId}`,
      cwd: () => state.root || "/",
      saved: () => state.terminal,
      save: (t) => update({ terminal: t }),
      onOutput: (cb) => {
        listeners.add(cb);
        return () => listeners.delete(cb);
      },
    });
    if (state.root) {
      wsInput.value = state.root;
      setRoot(state.root);
      if (state.open && relative(state.root, state.open) !== null) showFile(state.open);
    } else {
      showRoots();
    }
    refreshSessions();
    if (state.session_id) refreshTurns();
  })();
  const poll = setInterval(() => {
    refreshSessions();
    refreshTurns();
  }, 3000);
  cleanups.push(() => clearInterval(poll));

  return () => {
    saveState.cancel();
    for (const c of cleanups) {
      try {
        c();
      } catch {
        /* keep tearing down */
      }
    }
    if (disposeTerminal) disposeTerminal();
    clear(el);
  };
}

function concat(parts) {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
