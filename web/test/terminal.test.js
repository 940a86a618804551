import { test, beforeEach } from "node:test";
import assert from "node:assert/strict";
import { byTestId, byTestIdAll, settle } from "../testkit/fakedom.js";
import { fakeCall, fail, deferred } from "../testkit/fakeengine.js";
import { FakeTerminal, fakeXterm } from "../testkit/faketerm.js";
import { createFanout } from "../src/transport.js";
import { h } from "../src/dom.js";
import { clampFont, loadFont, saveFont, createTerminalPane, FONT_KEY } from "../src/terminal.js";

const b64 = (s) => Buffer.from(s).toString("base64");
beforeEach(() => localStorage.clear());

test("clampFont: whole pixels from 8 to 40; anything else the default", () => {
  assert.deepEqual([7, 8, 14.4, 14.5, 40, 41, "20", "x", NaN, undefined].map(clampFont), [8, 8, 14, 15, 40, 40, 20, 14, 14, 14]);
});

test("the font size is kept per browser, in localStorage", () => {
  assert.equal(loadFont(), 14);
  saveFont(17);
  assert.equal(localStorage.getItem(FONT_KEY), "17");
  assert.equal(loadFont(), 17);
  localStorage.setItem(FONT_KEY, "99");
  assert.equal(loadFont(), 40);
});

function mount(routes, { saved = null } = {}) {
  const call = fakeCall({ "shell::pty::sessions": { sessions: [] }, ...routes });
  const out = createFanout();
  const stored = [];
  const el = h("section");
  const dispose = createTerminalPane(
    el,
    { call, outputFid: "iii::shell-ui::pty-output::b1", cwd: () => "/w", saved: () => saved, save: (t) => stored.push(t), onOutput: out.add },
    fakeXterm,
  );
  return { call, out, stored, el, dispose, term: FakeTerminal.last, status: () => byTestId(el, "term-status").textContent };
}

const opened = { session_id: "0123456789abcdef", access_key: "ak", reconnect_token: "rt", cwd: "/w" };

test("New terminal opens a session in the workspace, streaming to this browser", async () => {
  const { call, stored, el, term, status, out } = mount({ "shell::pty::open": opened });
  await settle();
  assert.equal(status(), "no terminal");
  byTestId(el, "term-new").click();
  await settle();
  assert.deepEqual(call.to("shell::pty::open"), [{ cwd: "/w", cols: 80, rows: 24, output_function_id: "iii::shell-ui::pty-output::b1" }]);
  assert.equal(status(), "session 01234567 in /w");
  assert.deepEqual(stored, [{ session_id: "0123456789abcdef", reconnect_token: "rt" }]);
  assert.equal(term.focused, 1);
  out.emit({ session_id: "0123456789abcdef", sequence: 1, data: b64("hi\r\n") });
  out.emit({ session_id: "someone-else", sequence: 2, data: b64("not mine") });
  assert.equal(term.written, "hi\r\n");
});

test("output: in sequence order, repeats dropped; the end says the exit code and forgets the session", async () => {
  const { stored, el, term, status, out } = mount({ "shell::pty::open": opened });
  byTestId(el, "term-new").click();
  await settle();
  out.emit({ session_id: opened.session_id, sequence: 1, data: b64("a") });
  out.emit({ session_id: opened.session_id, sequence: 1, data: b64("a") });
  out.emit({ session_id: opened.session_id, sequence: 2, data: b64("b") });
  out.emit({ session_id: opened.session_id, data: b64("c") });
  assert.equal(term.written, "abc");
  out.emit({ session_id: opened.session_id, sequence: 3, eof: true, exit_code: 0 });
  assert.equal(status(), "exited (0)");
  assert.deepEqual(stored.at(-1), null);
  out.emit({ session_id: opened.session_id, sequence: 4, eof: true, exit_code: null });
  assert.equal(status(), "exited");
});

test("typing writes base64 in order; a resize is sent; a failed write says so", async () => {
  let failNext = false;
  const { call, el, term, status } = mount({ "shell::pty::open": opened, "shell::pty::write": () => (failNext ? Promise.reject({ code: "S240", message: "gone" }) : {}), "shell::pty::resize": {} });
  term.type("before a session");
  await settle();
  assert.deepEqual(call.to("shell::pty::write"), []);
  byTestId(el, "term-new").click();
  await settle();
  term.type("echo hi\r");
  term.type("é");
  await settle();
  assert.deepEqual(call.to("shell::pty::write"), [
    { session_id: opened.session_id, access_key: "ak", data: b64("echo hi\r") },
    { session_id: opened.session_id, access_key: "ak", data: b64("é") },
  ]);
  term.resize(100, 30);
  assert.deepEqual(call.to("shell::pty::resize"), [{ session_id: opened.session_id, access_key: "ak", cols: 100, rows: 30 }]);
  failNext = true;
  term.type("x");
  await settle();
  assert.equal(status(), "write failed: S240: gone");
});

test("a saved session is reattached with its scrollback replayed, output held until then", async () => {
  const answer = deferred();
  const { call, stored, term, status, out } = mount({ "shell::pty::attach": () => answer.promise }, { saved: { session_id: "fedcba9876543210", reconnect_token: "rt0" } });
  await settle();
  assert.deepEqual(call.to("shell::pty::attach"), [{ session_id: "fedcba9876543210", reconnect_token: "rt0", after_sequence: 0, cols: 80, rows: 24, output_function_id: "iii::shell-ui::pty-output::b1" }]);
  // Pushed while the attach is under way: one frame the replay holds, one after it.
  out.emit({ session_id: "fedcba9876543210", sequence: 2, data: b64("two ") });
  out.emit({ session_id: "fedcba9876543210", sequence: 3, data: b64("three") });
  assert.equal(term.written, "");
  answer.resolve({ access_key: "ak2", reconnect_token: "rt2", cwd: "/w", frames: [{ sequence: 1, data: b64("one ") }, { sequence: 2, data: b64("two ") }], next_sequence: 3 });
  await settle();
  assert.equal(term.written, "one two three");
  assert.equal(status(), "reattached fedcba98 in /w");
  assert.deepEqual(stored, [{ session_id: "fedcba9876543210", reconnect_token: "rt2" }]);
  assert.deepEqual(call.to("shell::pty::sessions"), [{}]);
});

test("a saved session that cannot be reattached is forgotten", async () => {
  const { stored, status } = mount({ "shell::pty::attach": fail("S241", "RECONNECT_DENIED") }, { saved: { session_id: "s", reconnect_token: "t" } });
  await settle();
  assert.equal(status(), "reattached failed: S241: RECONNECT_DENIED");
  assert.deepEqual(stored, [null]);
});

test("Adopt is offered for this page family's detached sessions only, and takes one over", async () => {
  const sessions = [
    { session_id: "aaaaaaaa11", ui: "shell", status: "detached", cwd: "/w" },
    { session_id: "bbbbbbbb22", ui: "shell", status: "attached", cwd: "/w" },
    { session_id: "cccccccc33", ui: "other", status: "detached", cwd: "/w" },
  ];
  const { call, el, term, status } = mount({
    "shell::pty::sessions": () => ({ sessions }),
    "shell::pty::adopt": { access_key: "ak", reconnect_token: "rt", cwd: "/w", frames: [{ sequence: 5, data: b64("hi") }], next_sequence: 6 },
  });
  await settle();
  const adopt = byTestIdAll(el, "adopt");
  assert.deepEqual(adopt.map((b) => [b.textContent, b.getAttribute("title")]), [["Adopt aaaaaaaa", "adopt the detached session in /w"]]);
  adopt[0].click();
  await settle();
  assert.deepEqual(call.to("shell::pty::adopt"), [{ session_id: "aaaaaaaa11", output_function_id: "iii::shell-ui::pty-output::b1", cols: 80, rows: 24, after_sequence: 0 }]);
  assert.equal(status(), "adopted aaaaaaaa in /w");
  assert.equal(term.written, "hi");
  // Listed again: the adopted one is this page's own now, so it is not offered.
  assert.equal(call.to("shell::pty::sessions").length, 2);
  assert.equal(byTestIdAll(el, "adopt").length, 0);
});

test("a failed session listing shows in place of the Adopt buttons", async () => {
  const { el } = mount({ "shell::pty::sessions": fail("S242", "no") });
  await settle();
  assert.equal(byTestId(el, "orphans").textContent, "sessions: S242: no");
});

test("the font stepper, Ctrl+wheel, and the per-browser size", async () => {
  localStorage.setItem(FONT_KEY, "39");
  const { el, term } = mount({});
  assert.equal(term.options.fontSize, 39);
  assert.equal(byTestId(el, "font-size").textContent, "39px");
  byTestId(el, "font-up").click();
  byTestId(el, "font-up").click();
  assert.equal(byTestId(el, "font-size").textContent, "40px");
  assert.equal(localStorage.getItem(FONT_KEY), "40");
  const screen = byTestId(el, "terminal");
  let prevented = 0;
  screen.dispatch("wheel", { ctrlKey: true, deltaY: 1, preventDefault: () => prevented++ });
  screen.dispatch("wheel", { ctrlKey: false, deltaY: 1, preventDefault: () => prevented++ });
  assert.equal(term.options.fontSize, 39);
  assert.equal(prevented, 1);
  byTestId(el, "font-down").click();
  assert.equal(byTestId(el, "font-size").textContent, "38px");
});

test("teardown detaches the held session and disposes of the terminal", async () => {
  const { call, el, term, dispose, out } = mount({ "shell::pty::open": opened, "shell::pty::detach": {} });
  byTestId(el, "term-new").click();
  await settle();
  const resizeListeners = globalThis.window.listeners.get("resize").size;
  dispose();
  await settle();
  assert.deepEqual(call.to("shell::pty::detach"), [{ session_id: opened.session_id, access_key: "ak" }]);
  assert.equal(term.disposed, true);
  assert.equal(globalThis.window.listeners.get("resize").size, resizeListeners - 1);
  out.emit({ session_id: opened.session_id, sequence: 9, data: b64("late") });
  assert.equal(term.written, "");
});
