import { test, mock } from "node:test";
import assert from "node:assert/strict";
import { fakeCall, fail } from "../testkit/fakeengine.js";
import { settle } from "../testkit/fakedom.js";
import { STATE_KEY, INITIAL_STATE, restoredState, createPaneState } from "../src/state.js";

test("restoredState: a stored object overrides its own fields; anything else keeps the state", () => {
  const s = { ...INITIAL_STATE, session_id: "s" };
  assert.deepEqual(restoredState(s, { state: { root: "/w", open: "/w/a" } }), { root: "/w", open: "/w/a", session_id: "s", terminal: null });
  assert.equal(restoredState(s, { state: null }), s);
  assert.equal(restoredState(s, { state: "x" }), s);
  assert.equal(restoredState(s, null), s);
  assert.equal(restoredState(s, {}), s);
});

test("update merges at once and saves the whole state once, after the quiet time", async () => {
  mock.timers.enable({ apis: ["setTimeout"] });
  try {
    const call = fakeCall({ "shell::ui-state::set": {} });
    const state = createPaneState(call);
    state.update({ root: "/w" });
    state.update({ open: "/w/a.rs" });
    assert.deepEqual(state.get(), { root: "/w", open: "/w/a.rs", session_id: "", terminal: null });
    mock.timers.tick(199);
    assert.deepEqual(call.calls, []);
    mock.timers.tick(1);
    assert.deepEqual(call.calls, [["shell::ui-state::set", { key: STATE_KEY, state: { root: "/w", open: "/w/a.rs", session_id: "", terminal: null } }]]);
    state.update({ session_id: "s1" });
    state.cancel();
    mock.timers.tick(1000);
    assert.equal(call.calls.length, 1);
  } finally {
    mock.timers.reset();
  }
});

test("restore reads the stored state under the pane key; a failed read keeps the defaults", async () => {
  const call = fakeCall({ "shell::ui-state::get": { state: { root: "/w", terminal: { session_id: "p", reconnect_token: "t" } } } });
  const state = createPaneState(call);
  assert.deepEqual(await state.restore(), { root: "/w", open: null, session_id: "", terminal: { session_id: "p", reconnect_token: "t" } });
  assert.deepEqual(call.calls, [["shell::ui-state::get", { key: "shell:explorer" }]]);

  const warn = mock.method(console, "warn", () => {});
  try {
    const broken = createPaneState(fakeCall({ "shell::ui-state::get": fail("S210", "bad") }));
    assert.deepEqual(await broken.restore(), INITIAL_STATE);
    assert.equal(warn.mock.callCount(), 1);
  } finally {
    warn.mock.restore();
  }
});

test("a failed save is only a warning", async () => {
  const warn = mock.method(console, "warn", () => {});
  try {
    const state = createPaneState(fakeCall({ "shell::ui-state::set": fail("S218", "too many panes") }), { saveDelay: 0 });
    state.update({ root: "/w" });
    await new Promise((r) => setTimeout(r, 5));
    await settle();
    assert.deepEqual(warn.mock.calls.map((c) => c.arguments), [["ui-state::set", { code: "S218", message: "too many panes" }]]);
  } finally {
    warn.mock.restore();
  }
});
