process.env.TZ = "UTC";
import { test } from "node:test";
import assert from "node:assert/strict";
import { byTestId, byTestIdAll, findAll, settle } from "../testkit/fakedom.js";
import { fakeCall, fail } from "../testkit/fakeengine.js";
import { sessionsLimit, mergeSessions, turnCount, sessionTooltip, sessionTimes, revertRequest, revertSummary, restoredPaths, createTurnsPane, SESSIONS_PAGE, SESSIONS_MAX } from "../src/turns.js";

const T = (h, m, s) => Date.UTC(2026, 0, 2, h, m, s);
const session = (id, n, extra = {}) => ({ session_id: id, turn_count: n, first_started_at: T(9, 0, 0), last_started_at: T(10, 0, 0), updated_at: T(10, 5, 0), ...extra });

test("sessionsLimit: as many as shown, a page at least, 200 at most", () => {
  assert.deepEqual([SESSIONS_PAGE, SESSIONS_MAX], [20, 200]);
  assert.equal(sessionsLimit(0), 20);
  assert.equal(sessionsLimit(45), 45);
  assert.equal(sessionsLimit(500), 200);
});

test("mergeSessions: an older page adds only the sessions not shown yet", () => {
  const got = mergeSessions([session("a", 1), session("b", 1)], [session("b", 2), session("c", 1)]);
  assert.deepEqual(got.map((s) => [s.session_id, s.turn_count]), [["a", 1], ["b", 1], ["c", 1]]);
  assert.deepEqual(mergeSessions([session("a", 1)], undefined).length, 1);
});

test("a session row's texts", () => {
  assert.deepEqual([turnCount(0), turnCount(1), turnCount(2)], ["0 turns", "1 turn", "2 turns"]);
  assert.equal(sessionTooltip(session("s", 1)), "s\nfirst turn started 2026-01-02 09:00:00\nlast turn started 2026-01-02 10:00:00\nhistory changed 2026-01-02 10:05:00");
  assert.equal(sessionTimes(session("s", 1), T(23, 0, 0)), "10:05:00 · first 09:00:00");
  assert.equal(sessionTimes(session("s", 1), Date.UTC(2026, 0, 5)), "2026-01-02 10:05 · first 2026-01-02 09:00");
});

test("revertRequest: a whole turn, or some of its files", () => {
  assert.deepEqual(revertRequest("s", "t", null), { session_id: "s", turn_id: "t" });
  assert.deepEqual(revertRequest("s", "t", ["/w/a"]), { session_id: "s", turn_id: "t", paths: ["/w/a"] });
});

test("revertSummary and restoredPaths", () => {
  const r = {
    reverted: 2,
    failed: 2,
    results: [
      { path: "/w/a", success: true, action: "restored" },
      { path: "/w/b", success: false, error: "C205: changed since" },
      { path: "/w/target/x", success: true, action: "restored" },
      { path: "/w/n", success: true, action: "deleted" },
      { path: "/w/c", success: false, error: "C201: denied" },
      { path: "/w/d", success: true, action: "restored" },
    ],
  };
  assert.equal(revertSummary(r), "reverted 2, failed 2: C205: changed since; C201: denied");
  assert.equal(revertSummary({ reverted: 1, failed: 0, results: [] }), "reverted 1, failed 0");
  assert.deepEqual(restoredPaths(r, "/w"), ["/w/a", "/w/d"]);
  assert.deepEqual(restoredPaths({}, "/w"), []);
  // With no workspace open the paths are judged from `/`.
  assert.deepEqual(restoredPaths(r, null), ["/w/a", "/w/d"]);
});

function fakeState(initial = {}) {
  let s = { root: "/w", open: null, session_id: "", terminal: null, ...initial };
  return { get: () => s, update: (p) => (s = { ...s, ...p }) };
}

function mount(routes, state = fakeState()) {
  const call = fakeCall(routes);
  const reverted = [];
  const pane = createTurnsPane({ call, state, root: () => state.get().root, onReverted: (p) => reverted.push(p) });
  const items = () =>
    byTestIdAll(pane.el, "turns-session-item").map((e) => [e.getAttribute("data-session-id"), byTestId(e, "session-turn-count").textContent, e.className]);
  return { call, pane, state, reverted, items };
}

const turns = {
  turns: [
    { turn_id: "t1", title: "greet the world", file_count: 1, files: [{ path: "/w/hello.rs", kind: "modified" }] },
    { turn_id: "t2", files: [{ path: "/w/src/lib.rs", kind: "created" }, { path: "/w/README.md", kind: "modified" }] },
  ],
};

test("the sessions list: newest first as the worker sends them, titles, and the older-sessions button", async () => {
  const { call, pane, items } = mount({ "shell::turns::sessions": { sessions: [session("b", 2, { last_title: "look" }), session("a", 1)], next_cursor: "c1" } });
  const more = byTestId(pane.el, "turns-sessions-more");
  assert.equal(more.hidden, true);
  await pane.refreshSessions();
  assert.deepEqual(call.calls, [["shell::turns::sessions", { limit: 20 }]]);
  assert.deepEqual(items(), [["b", "2 turns", "shell-session"], ["a", "1 turn", "shell-session"]]);
  assert.deepEqual(byTestIdAll(pane.el, "session-title").map((e) => e.textContent), ["look"]);
  assert.equal(more.hidden, false);
});

test("older sessions: the cursor's page, merged, until there is no cursor", async () => {
  const { call, pane, items } = mount({
    "shell::turns::sessions": (p) => (p.cursor ? { sessions: [session("b", 2), session("c", 1)], next_cursor: null } : { sessions: [session("a", 1), session("b", 2)], next_cursor: "c1" }),
  });
  await pane.refreshSessions();
  byTestId(pane.el, "turns-sessions-more").click();
  await settle();
  assert.deepEqual(call.to("shell::turns::sessions"), [{ limit: 20 }, { limit: 20, cursor: "c1" }]);
  assert.deepEqual(items().map((i) => i[0]), ["a", "b", "c"]);
  assert.equal(byTestId(pane.el, "turns-sessions-more").hidden, true);
});

test("no sessions, and a failed listing", async () => {
  const empty = mount({ "shell::turns::sessions": { sessions: [] } });
  await empty.pane.refreshSessions();
  assert.equal(byTestId(empty.pane.el, "turns-sessions").textContent, "no session has recorded turns yet");
  const broken = mount({ "shell::turns::sessions": fail("S230", "store unreadable") });
  await broken.pane.refreshSessions();
  assert.equal(byTestId(broken.pane.el, "turns-sessions").textContent, "sessions: S230: store unreadable");
});

test("a click opens a session: stored, marked, its id typed, its turns listed", async () => {
  const { call, pane, state, items } = mount({ "shell::turns::sessions": { sessions: [session("b", 2), session("a", 1)] }, "shell::turns::list": turns });
  await pane.refreshSessions();
  assert.equal(byTestId(pane.el, "turns-current").textContent, "no session open");
  byTestIdAll(pane.el, "turns-session-item")[1].click();
  await settle();
  assert.equal(state.get().session_id, "a");
  assert.equal(byTestId(pane.el, "turns-session").value, "a");
  assert.deepEqual(items().map((i) => i[2]), ["shell-session", "shell-session shell-selected"]);
  assert.equal(byTestId(pane.el, "turns-current").textContent, "Turns of a");
  assert.deepEqual(call.to("shell::turns::list"), [{ session_id: "a" }]);
  const rows = byTestIdAll(pane.el, "turn");
  assert.deepEqual(rows.map((r) => r.getAttribute("data-turn-id")), ["t1", "t2"]);
  assert.equal(rows[0].childNodes[0].textContent, "greet the world 1 file(s)Revert turn");
  assert.equal(rows[1].childNodes[0].textContent, "t2 2 file(s)Revert turn");
  assert.deepEqual(findAll(rows[1], (e) => e.tagName === "LI").map((e) => e.textContent), ["created src/lib.rs revert", "modified README.md revert"]);
});

test("a typed id loads as a click does; an empty one does nothing", async () => {
  const { call, pane, state } = mount({ "shell::turns::sessions": { sessions: [] }, "shell::turns::list": { turns: [] } });
  byTestId(pane.el, "turns-session").value = "  ";
  byTestId(pane.el, "turns-load").click();
  await settle();
  assert.deepEqual(call.calls, []);
  byTestId(pane.el, "turns-session").value = " chat 9/side ";
  byTestId(pane.el, "turns-load").click();
  await settle();
  assert.equal(state.get().session_id, "chat 9/side");
  assert.equal(byTestId(pane.el, "turns-list").textContent, "no turns recorded");
});

test("revert a turn, then one file: the requests, the result line and the restored files", async () => {
  const answers = [
    { reverted: 1, failed: 0, results: [{ path: "/w/hello.rs", success: true, action: "restored" }] },
    { reverted: 0, failed: 1, results: [{ path: "/w/src/lib.rs", success: false, error: "C205: changed since the turn" }] },
  ];
  const { call, pane, reverted } = mount({ "shell::turns::list": turns, "shell::turns::revert": () => answers.shift() }, fakeState({ session_id: "s1" }));
  await pane.refreshTurns();
  byTestId(byTestIdAll(pane.el, "turn")[0], "revert-turn").click();
  await settle();
  const note = byTestId(pane.el, "revert-result");
  assert.deepEqual([note.className, note.textContent], ["shell-muted", "reverted 1, failed 0"]);
  byTestIdAll(byTestIdAll(pane.el, "turn")[1], "revert-file")[0].click();
  await settle();
  assert.deepEqual([note.className, note.textContent], ["shell-error", "reverted 0, failed 1: C205: changed since the turn"]);
  assert.deepEqual(call.to("shell::turns::revert"), [
    { session_id: "s1", turn_id: "t1" },
    { session_id: "s1", turn_id: "t2", paths: ["/w/src/lib.rs"] },
  ]);
  assert.deepEqual(reverted, [["/w/hello.rs"], []]);
});

test("a failed revert says so and changes nothing else", async () => {
  const { pane, reverted } = mount({ "shell::turns::list": turns, "shell::turns::revert": fail("S231", "no such turn") }, fakeState({ session_id: "s1" }));
  await pane.refreshTurns();
  byTestIdAll(pane.el, "revert-turn")[0].click();
  await settle();
  const note = byTestId(pane.el, "revert-result");
  assert.deepEqual([note.className, note.textContent], ["shell-error", "revert failed: S231: no such turn"]);
  assert.deepEqual(reverted, []);
});

test("a failed turn listing shows its error; no session, no call", async () => {
  const { call, pane } = mount({ "shell::turns::list": fail("S232", "bad id") });
  await pane.refreshTurns();
  assert.deepEqual(call.calls, []);
  pane.open("s");
  await settle();
  assert.equal(byTestId(pane.el, "turns-list").textContent, "S232: bad id");
  pane.showSession("restored");
  assert.equal(byTestId(pane.el, "turns-session").value, "restored");
  pane.showSession(undefined);
  assert.equal(byTestId(pane.el, "turns-session").value, "");
});
