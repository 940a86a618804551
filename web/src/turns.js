// The turn history (shell::turns::*): the sessions with recorded turns, newest first
// (shell::turns::sessions, a page at a time), one click opens one; its turns with their files,
// and revert of a turn or of one file (shell::turns::list/revert). A session id can be typed.
import { h, clear, errorText } from "./dom.js";
import { relative, isNoise } from "./paths.js";
import { fullTime, shortTime } from "./times.js";

// Sessions asked for at a time (shell::turns::sessions takes at most 200 per call).
export const SESSIONS_PAGE = 20;
export const SESSIONS_MAX = 200;

// How many sessions a refresh asks for: as many as are shown (older pages the user opened
// stay open), at least a page, at most what one call takes.
export function sessionsLimit(shown) {
  return Math.min(SESSIONS_MAX, Math.max(SESSIONS_PAGE, shown));
}

// `shown` followed by the sessions of an older page it does not hold yet (a session that
// changed meanwhile moved up and is already shown).
export function mergeSessions(shown, older) {
  const seen = new Set(shown.map((s) => s.session_id));
  return shown.concat((older || []).filter((s) => !seen.has(s.session_id)));
}

export function turnCount(n) {
  return `${n} turn${n === 1 ? "" : "s"}`;
}

// The tooltip of a session row.
export function sessionTooltip(s) {
  return `${s.session_id}\nfirst turn started ${fullTime(s.first_started_at)}\nlast turn started ${fullTime(s.last_started_at)}\nhistory changed ${fullTime(s.updated_at)}`;
}

export function sessionTimes(s, now = Date.now()) {
  return `${shortTime(s.updated_at, now)} · first ${shortTime(s.first_started_at, now)}`;
}

// The shell::turns::revert request for a whole turn (`paths` null) or some of its files.
export function revertRequest(sessionId, turnId, paths) {
  const payload = { session_id: sessionId, turn_id: turnId };
  if (paths) payload.paths = paths;
  return payload;
}

// The line shown after a revert answer.
export function revertSummary(r) {
  return `reverted ${r.reverted}, failed ${r.failed}${r.failed ? ": " + r.results.filter((x) => x.error).map((x) => x.error).join("; ") : ""}`;
}

// The files a revert restored that may take over the diff view (noise never does), in order.
export function restoredPaths(r, root) {
  return (r.results || []).filter((x) => x.success && x.action === "restored" && !isNoise(root || "", x.path)).map((x) => x.path);
}

// ctx: {call(fid, payload), state: {get(), update(patch)}, root() -> workspace or null,
// onReverted(restored paths)}.
export function createTurnsPane(ctx) {
  const input = h("input", { class: "shell-session-input", "data-testid": "turns-session", placeholder: "or type a session id", spellcheck: "false" });
  const list = h("div", { class: "shell-sessions", "data-testid": "turns-sessions" });
  const more = h("button", { class: "shell-small", "data-testid": "turns-sessions-more", hidden: true, onclick: () => moreSessions() }, "older sessions");
  const current = h("div", { class: "shell-subtitle", "data-testid": "turns-current", text: "no session open" });
  const turnsList = h("div", { class: "shell-turns-list", "data-testid": "turns-list" });
  const note = h("div", { class: "shell-muted", "data-testid": "revert-result" });
  const el = h(
    "aside",
    { class: "shell-turns" },
    h("div", { class: "shell-pane-title", text: "Turns" }),
    h("div", { class: "shell-subtitle", text: "Sessions" }),
    list,
    more,
    h("div", { class: "shell-row" }, input, h("button", { "data-testid": "turns-load", onclick: () => open(input.value.trim()) }, "Load")),
    current,
    note,
    turnsList,
  );
  const sessionId = () => ctx.state.get().session_id;
  const shownPath = (path) => relative(ctx.root() || "", path) ?? path;

  let sessionsGen = 0;
  let sessions = [];
  let cursor = null;
  let turnsGen = 0;

  function open(id) {
    if (!id) return;
    input.value = id;
    ctx.state.update({ session_id: id });
    renderSessions();
    refreshTurns();
  }

  function sessionRow(s) {
    return h(
      "button",
      {
        class: `shell-session${s.session_id === sessionId() ? " shell-selected" : ""}`,
        "data-testid": "turns-session-item",
        "data-session-id": s.session_id,
        title: sessionTooltip(s),
        onclick: () => open(s.session_id),
      },
      h("span", { class: "shell-session-head" }, h("code", { class: "shell-session-id", text: s.session_id }), h("span", { class: "shell-muted", "data-testid": "session-turn-count", text: turnCount(s.turn_count) })),
      s.last_title ? h("span", { class: "shell-session-title", "data-testid": "session-title", text: s.last_title }) : null,
      h("span", { class: "shell-muted shell-session-times", "data-testid": "session-times", text: sessionTimes(s) }),
    );
  }

  function renderSessions() {
    clear(list);
    if (!sessions.length) list.append(h("div", { class: "shell-muted", text: "no session has recorded turns yet" }));
    for (const s of sessions) list.append(sessionRow(s));
    more.hidden = !cursor;
  }

  async function refreshSessions() {
    const mine = ++sessionsGen;
    try {
      const r = await ctx.call("shell::turns::sessions", { limit: sessionsLimit(sessions.length) });
      if (mine !== sessionsGen) return;
      sessions = r.sessions || [];
      cursor = r.next_cursor ?? null;
      renderSessions();
    } catch (e) {
      if (mine !== sessionsGen) return;
      clear(list);
      list.append(h("div", { class: "shell-error", text: `sessions: ${errorText(e)}` }));
    }
  }

  async function moreSessions() {
    if (!cursor) return;
    const mine = ++sessionsGen;
    try {
      const r = await ctx.call("shell::turns::sessions", { limit: SESSIONS_PAGE, cursor });
      if (mine !== sessionsGen) return;
      sessions = mergeSessions(sessions, r.sessions);
      cursor = r.next_cursor ?? null;
      renderSessions();
    } catch (e) {
      list.append(h("div", { class: "shell-error", text: `sessions: ${errorText(e)}` }));
    }
  }

  function turnRow(t) {
    const files = h("ul", { class: "shell-turn-files" });
    for (const f of t.files || []) {
      files.append(
        h(
          "li",
          {},
          h("span", { class: `shell-kind-${f.kind}`, text: f.kind }),
          " ",
          h("code", { text: shownPath(f.path) }),
          " ",
          h("button", { class: "shell-small", "data-testid": "revert-file", onclick: () => revert(t.turn_id, [f.path]) }, "revert"),
        ),
      );
    }
    return h(
      "div",
      { class: "shell-turn", "data-testid": "turn", "data-turn-id": t.turn_id },
      h("div", { class: "shell-row" }, h("strong", { text: t.title || t.turn_id }), h("span", { class: "shell-muted", text: ` ${t.file_count ?? (t.files || []).length} file(s)` }), h("button", { "data-testid": "revert-turn", onclick: () => revert(t.turn_id, null) }, "Revert turn")),
      files,
    );
  }

  async function refreshTurns() {
    const sid = sessionId();
    current.textContent = sid ? `Turns of ${sid}` : "no session open";
    if (!sid) return;
    const mine = ++turnsGen;
    try {
      const { turns } = await ctx.call("shell::turns::list", { session_id: sid });
      if (mine !== turnsGen) return;
      clear(turnsList);
      if (!turns.length) turnsList.append(h("div", { class: "shell-muted", text: "no turns recorded" }));
      for (const t of turns) turnsList.append(turnRow(t));
    } catch (e) {
      clear(turnsList);
      turnsList.append(h("div", { class: "shell-error", text: errorText(e) }));
    }
  }

  async function revert(turnId, paths) {
    note.textContent = "";
    try {
      const r = await ctx.call("shell::turns::revert", revertRequest(sessionId(), turnId, paths));
      note.className = r.failed ? "shell-error" : "shell-muted";
      note.textContent = revertSummary(r);
      ctx.onReverted(restoredPaths(r, ctx.root()));
    } catch (e) {
      note.className = "shell-error";
      note.textContent = `revert failed: ${errorText(e)}`;
    }
  }

  // The typed id follows the stored session (after a restore).
  function showSession(id) {
    input.value = id || "";
  }

  return { el, open, refreshSessions, refreshTurns, showSession };
}
