// Terminals on shell::pty::*: xterm.js in the page, output pushed by the worker to a
// browser-side function, reattach after a reload (the session id and reconnect token live in
// the page's ui-state), adopt an orphaned session, and a per-browser font size (8–40 px).
// Namespace imports: the packages are CommonJS, which node (the unit tests, which pass a
// stand-in) cannot import by name; the bundler resolves both forms alike.
import * as xterm from "@xterm/xterm";
import * as xtermFit from "@xterm/addon-fit";
import { h, clear, errorText, bytesToBase64, base64ToBytes } from "./dom.js";

export const FONT_KEY = "iii-shell:terminal-font-size";
export const FONT_MIN = 8;
export const FONT_MAX = 40;
export const FONT_DEFAULT = 14;

export function clampFont(n) {
  const v = Math.round(Number(n));
  if (!Number.isFinite(v)) return FONT_DEFAULT;
  return Math.min(FONT_MAX, Math.max(FONT_MIN, v));
}

export function loadFont() {
  try {
    const v = localStorage.getItem(FONT_KEY);
    return v === null ? FONT_DEFAULT : clampFont(v);
  } catch {
    return FONT_DEFAULT;
  }
}

export function saveFont(n) {
  try {
    localStorage.setItem(FONT_KEY, String(n));
  } catch {
    /* a browser without storage keeps the size for this page only */
  }
}

const encoder = new TextEncoder();

// ctx: {call(fid, payload), outputFid, cwd(), saved(), save(state|null), onOutput(cb) -> unsubscribe}
// lib: the terminal emulator (xterm.js; the unit tests pass a stand-in).
export function createTerminalPane(el, ctx, lib = { Terminal: xterm.Terminal, FitAddon: xtermFit.FitAddon }) {
  let fontSize = loadFont();
  const term = new lib.Terminal({ fontSize, convertEol: false, scrollback: 5000, fontFamily: "monospace" });
  const fit = new lib.FitAddon();
  term.loadAddon(fit);

  const status = h("span", { class: "shell-muted", "data-testid": "term-status", text: "no terminal" });
  const fontLabel = h("span", { "data-testid": "font-size", text: `${fontSize}px` });
  const orphans = h("span", { class: "shell-orphans", "data-testid": "orphans" });
  const screen = h("div", { class: "shell-term-screen", "data-testid": "terminal" });
  const bar = h(
    "div",
    { class: "shell-term-bar" },
    h("button", { "data-testid": "term-new", onclick: () => openNew() }, "New terminal"),
    h("button", { "data-testid": "font-down", title: "Smaller text", onclick: () => setFont(fontSize - 1) }, "A−"),
    fontLabel,
    h("button", { "data-testid": "font-up", title: "Larger text", onclick: () => setFont(fontSize + 1) }, "A+"),
    status,
    orphans,
  );
  el.append(bar, screen);
  term.open(screen);

  let session = null; // {session_id, access_key, reconnect_token}
  let lastApplied = 0;
  let attaching = false;
  let queued = [];
  let writes = Promise.resolve();
  let disposed = false;

  function setStatus(t) {
    status.textContent = t;
  }

  function refit() {
    try {
      fit.fit();
    } catch {
      /* not laid out yet */
    }
  }

  function setFont(n) {
    fontSize = clampFont(n);
    fontLabel.textContent = `${fontSize}px`;
    term.options.fontSize = fontSize;
    saveFont(fontSize);
    refit();
  }

  screen.addEventListener(
    "wheel",
    (ev) => {
      if (!(ev.ctrlKey || ev.metaKey)) return;
      ev.preventDefault();
      setFont(fontSize + (ev.deltaY < 0 ? 1 : -1));
    },
    { passive: false },
  );

  function apply(ev) {
    if (!session || ev.session_id !== session.session_id) return;
    if (attaching) {
      queued.push(ev);
      return;
    }
    if (typeof ev.sequence === "number" && ev.sequence <= lastApplied) return;
    if (ev.data) term.write(base64ToBytes(ev.data));
    if (typeof ev.sequence === "number") lastApplied = ev.sequence;
    if (ev.eof) {
      setStatus(`exited${ev.exit_code !== null && ev.exit_code !== undefined ? ` (${ev.exit_code})` : ""}`);
      ctx.save(null);
    }
  }
  const unsubscribe = ctx.onOutput(apply);

  function replay(resp) {
    term.reset();
    for (const f of resp.frames || []) {
      term.write(base64ToBytes(f.data));
      lastApplied = Math.max(lastApplied, f.sequence);
    }
    if (resp.next_sequence) lastApplied = Math.max(lastApplied, resp.next_sequence - 1);
  }

  async function take(kind, fid, payload, sessionId) {
    attaching = true;
    queued = [];
    session = { session_id: sessionId };
    lastApplied = 0;
    try {
      const resp = await ctx.call(fid, payload);
      session = { session_id: sessionId, access_key: resp.access_key, reconnect_token: resp.reconnect_token };
      replay(resp);
      ctx.save({ session_id: sessionId, reconnect_token: resp.reconnect_token });
      setStatus(`${kind} ${sessionId.slice(0, 8)} in ${resp.cwd}`);
      return true;
    } catch (e) {
      session = null;
      setStatus(`${kind} failed: ${errorText(e)}`);
      return false;
    } finally {
      attaching = false;
      const q = queued;
      queued = [];
      for (const ev of q) apply(ev);
    }
  }

  async function openNew() {
    refit();
    try {
      const resp = await ctx.call("shell::pty::open", { cwd: ctx.cwd(), cols: term.cols, rows: term.rows, output_function_id: ctx.outputFid });
      session = { session_id: resp.session_id, access_key: resp.access_key, reconnect_token: resp.reconnect_token };
      lastApplied = 0;
      term.reset();
      ctx.save({ session_id: resp.session_id, reconnect_token: resp.reconnect_token });
      setStatus(`session ${resp.session_id.slice(0, 8)} in ${resp.cwd}`);
      term.focus();
    } catch (e) {
      setStatus(`open failed: ${errorText(e)}`);
    }
  }

  async function listOrphans() {
    clear(orphans);
    try {
      const { sessions } = await ctx.call("shell::pty::sessions", {});
      for (const s of sessions) {
        if (s.ui !== "shell" || s.status !== "detached") continue;
        if (session && s.session_id === session.session_id) continue;
        orphans.append(
          h(
            "button",
            {
              "data-testid": "adopt",
              title: `adopt the detached session in ${s.cwd}`,
              onclick: async () => {
                refit();
                if (await take("adopted", "shell::pty::adopt", { session_id: s.session_id, output_function_id: ctx.outputFid, cols: term.cols, rows: term.rows, after_sequence: 0 }, s.session_id)) listOrphans();
              },
            },
            `Adopt ${s.session_id.slice(0, 8)}`,
          ),
        );
      }
    } catch (e) {
      orphans.append(h("span", { class: "shell-error", text: `sessions: ${errorText(e)}` }));
    }
  }

  term.onData((d) => {
    if (!session || !session.access_key) return;
    const s = session;
    const data = bytesToBase64(encoder.encode(d));
    writes = writes.then(() => ctx.call("shell::pty::write", { session_id: s.session_id, access_key: s.access_key, data }).catch((e) => setStatus(`write failed: ${errorText(e)}`)));
  });
  term.onResize(({ cols, rows }) => {
    if (!session || !session.access_key) return;
    ctx.call("shell::pty::resize", { session_id: session.session_id, access_key: session.access_key, cols, rows }).catch(() => {});
  });
  const onWindowResize = () => refit();
  window.addEventListener("resize", onWindowResize);

  (async () => {
    refit();
    const saved = ctx.saved();
    if (saved && saved.session_id && saved.reconnect_token) {
      const ok = await take("reattached", "shell::pty::attach", { session_id: saved.session_id, reconnect_token: saved.reconnect_token, after_sequence: 0, cols: term.cols, rows: term.rows, output_function_id: ctx.outputFid }, saved.session_id);
      if (!ok) ctx.save(null);
    }
    if (!disposed) listOrphans();
  })();

  return () => {
    disposed = true;
    unsubscribe();
    window.removeEventListener("resize", onWindowResize);
    if (session && session.access_key) {
      ctx.call("shell::pty::detach", { session_id: session.session_id, access_key: session.access_key }).catch(() => {});
    }
    term.dispose();
  };
}
