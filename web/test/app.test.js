import { test, mock } from "node:test";
import assert from "node:assert/strict";
import { byTestId, byTestIdAll, findAll, settle } from "../testkit/fakedom.js";
import { fakeHost } from "../testkit/fakeengine.js";
import { fakeXterm } from "../testkit/faketerm.js";
import { h } from "../src/dom.js";
import { mountShellPage } from "../src/app.js";

const files = { "/w/a.rs": "fn a() {}\n", "/w/b.txt": "b\n" };
const routes = (stored) => ({
  "shell::ui-state::get": { state: stored },
  "shell::ui-state::set": {},
  "shell::workspace::roots": { roots: ["/w"] },
  "shell::workspace::validate": (p) => ({ path: p.path }),
  "coder::list-folder": () => ({ entries: Object.keys(files).map((p) => ({ name: p.slice(3), kind: "file", size: files[p].length })), has_more: false }),
  "coder::read-file": (p) => ({ content: files[p.path], is_utf8: true }),
  "shell::turns::sessions": { sessions: [] },
  "shell::turns::list": { turns: [] },
  "shell::pty::sessions": { sessions: [] },
  "shell::pty::detach": {},
});

// The page mounted on a fake host; intervals are mocked so the 3 s poll never runs on its own.
async function mount(stored) {
  mock.timers.enable({ apis: ["setInterval"] });
  const host = fakeHost(routes(stored), "b1");
  const el = h("div");
  const teardown = mountShellPage(el, { iii: host.iii }, fakeXterm);
  await settle();
  return { host, el, teardown };
}

test("the layout: every pane in its place, by the test ids the browser test drives", async (t) => {
  t.after(() => mock.timers.reset());
  const { el, teardown } = await mount(null);
  const root = el.childNodes[0];
  assert.equal(root.className, "shell-root");
  assert.deepEqual(root.childNodes.map((c) => [c.tagName, c.className]), [
    ["HEADER", "shell-top"],
    ["DIV", "shell-ws-choices"],
    ["DIV", "shell-body"],
    ["SECTION", "shell-term"],
  ]);
  assert.deepEqual(root.childNodes[2].childNodes.map((c) => [c.tagName, c.className]), [
    ["ASIDE", "shell-side"],
    ["DIV", "shell-main"],
    ["ASIDE", "shell-turns"],
  ]);
  const ids = findAll(el, (e) => e.hasAttribute("data-testid")).map((e) => e.getAttribute("data-testid"));
  assert.deepEqual(ids, [
    "ws-input", "ws-browse", "ws-open", "ws-current", "ws-error", "ws-choices", "ws-root", "tree", "file-view", "diff-view",
    "turns-sessions", "turns-sessions-more", "turns-session", "turns-load", "turns-current", "revert-result", "turns-list",
    "term-new", "font-down", "font-size", "font-up", "term-status", "orphans", "terminal",
  ]);
  teardown();
  assert.equal(el.childNodes.length, 0);
});

test("a fresh page: the roots, the sessions and the browser functions; teardown undoes them", async (t) => {
  t.after(() => mock.timers.reset());
  const { host, teardown } = await mount(null);
  assert.deepEqual(host.calls.calls.map((c) => c[0]), ["shell::ui-state::get", "shell::pty::sessions", "shell::workspace::roots", "shell::turns::sessions"]);
  assert.deepEqual(host.log, [["on", "iii::shell-ui::changed"], ["on", "iii::shell-ui::pty-output"]]);
  teardown();
  assert.deepEqual(host.log.slice(2), [["off", "iii::shell-ui::changed"], ["off", "iii::shell-ui::pty-output"]]);
});

test("a stored state is restored: workspace bound, open file shown, session loaded", async (t) => {
  t.after(() => mock.timers.reset());
  const { host, el, teardown } = await mount({ root: "/w", open: "/w/a.rs", session_id: "s1", terminal: null });
  assert.equal(byTestId(el, "ws-input").value, "/w");
  assert.equal(byTestId(el, "ws-current").textContent, "/w");
  assert.equal(byTestId(el, "turns-session").value, "s1");
  assert.deepEqual(host.bindings, [{ type: "shell::changed", function_id: "iii::shell-ui::changed::b1", config: { path: "/w", include_ignored: true }, bound: true }]);
  assert.deepEqual(byTestIdAll(el, "tree-entry").map((e) => [e.getAttribute("data-path"), e.className]), [
    ["/w/a.rs", "shell-tree-entry shell-selected"],
    ["/w/b.txt", "shell-tree-entry"],
  ]);
  assert.equal(byTestId(el, "file-content").textContent, "fn a() {}\n");
  assert.deepEqual(host.calls.to("shell::turns::list"), [{ session_id: "s1" }]);
  assert.equal(byTestId(el, "turns-current").textContent, "Turns of s1");
  teardown();
  assert.equal(host.bindings[0].bound, false);
});

test("an open file outside the stored workspace is not shown", async (t) => {
  t.after(() => mock.timers.reset());
  const { host, teardown } = await mount({ root: "/w", open: "/etc/passwd" });
  assert.deepEqual(host.calls.to("coder::read-file"), []);
  teardown();
});

test("picking a workspace rebinds the change feed; a change shows the file and its diff", async (t) => {
  t.after(() => mock.timers.reset());
  const { host, el, teardown } = await mount(null);
  byTestId(el, "ws-input").value = "/w";
  byTestId(el, "ws-open").click();
  await settle();
  assert.equal(host.bindings.length, 1);
  byTestIdAll(el, "tree-entry")[1].click();
  await settle();
  assert.equal(byTestId(el, "file-content").textContent, "b\n");
  files["/w/b.txt"] = "b2\n";
  await host.functions.get("iii::shell-ui::changed")({ root: "/w", path: "b.txt", kind: "modified" });
  await settle();
  assert.equal(byTestId(el, "file-content").textContent, "b2\n");
  assert.equal(byTestId(el, "diff-path").textContent, "b.txt");
  assert.deepEqual(byTestId(el, "diff-rows").childNodes.map((r) => r.textContent), ["-b", "+b2"]);
  // Another workspace's change does nothing.
  const before = host.calls.calls.length;
  await host.functions.get("iii::shell-ui::changed")({ root: "/elsewhere", path: "b.txt", kind: "modified" });
  await settle();
  assert.equal(host.calls.calls.length, before);
  // Picking again replaces the binding.
  byTestId(el, "ws-open").click();
  await settle();
  assert.deepEqual(host.bindings.map((b) => b.bound), [false, true]);
  files["/w/b.txt"] = "b\n";
  teardown();
});

test("the sessions and the open session's turns are polled every 3 s", async (t) => {
  t.after(() => mock.timers.reset());
  const { host, teardown } = await mount({ session_id: "s1" });
  const before = [host.calls.to("shell::turns::sessions").length, host.calls.to("shell::turns::list").length];
  mock.timers.tick(3000);
  await settle();
  assert.deepEqual([host.calls.to("shell::turns::sessions").length, host.calls.to("shell::turns::list").length], [before[0] + 1, before[1] + 1]);
  teardown();
  mock.timers.tick(3000);
  await settle();
  assert.equal(host.calls.to("shell::turns::sessions").length, before[0] + 1);
});
