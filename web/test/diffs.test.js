import { test } from "node:test";
import assert from "node:assert/strict";
import { byTestId, byTestIdAll, settle } from "../testkit/fakedom.js";
import { fakeCall, fail, deferred } from "../testkit/fakeengine.js";
import { createBaselines, DIFF_LIMIT } from "../src/baselines.js";
import { changeView, baselineView, tooLarge, createDiffPane } from "../src/diffs.js";

test("changeView: coder::change-diff's bodies", () => {
  assert.deepEqual(changeView("/w/a", { old_contents: "o", new_contents: "n", is_binary: false }), { path: "/w/a", oldText: "o", newText: "n", isBinary: false, source: "coder::change-diff" });
});

test("baselineView: against the body last seen, or nothing for a file never seen", () => {
  const r = { content: "new", is_utf8: true };
  assert.deepEqual(baselineView("/w/a", r, "modified", true, "old"), { path: "/w/a", oldText: "old", newText: "new", isBinary: false, source: "since last seen" });
  // An atomic replace reports `created`, but a body seen before is still the baseline.
  assert.deepEqual(baselineView("/w/a", r, "created", true, "old").source, "since last seen");
  assert.deepEqual(baselineView("/w/a", r, "created", false, undefined), { path: "/w/a", oldText: "", newText: "new", isBinary: false, source: "created" });
  assert.deepEqual(baselineView("/w/a", r, "modified", false, undefined).source, "new to this page");
  assert.deepEqual(baselineView("/w/a", { is_utf8: false }, "modified", false, undefined), { path: "/w/a", oldText: "", newText: "", isBinary: true, source: "new to this page" });
  // The same body again (rename and close come apart): nothing new to show.
  assert.equal(baselineView("/w/a", r, "modified", true, "new"), null);
});

test("tooLarge: old and new together over the limit", () => {
  assert.equal(tooLarge({ oldText: "a".repeat(DIFF_LIMIT - 1), newText: "b" }), false);
  assert.equal(tooLarge({ oldText: "a".repeat(DIFF_LIMIT), newText: "b" }), true);
  assert.equal(tooLarge({ oldText: undefined, newText: undefined }), false);
});

function mount(routes, baselines = createBaselines()) {
  const call = fakeCall(routes);
  const pane = createDiffPane({ call, root: () => "/w", baselines });
  const rows = () => byTestIdAll(pane.el, "diff-rows").flatMap((t) => t.childNodes.map((r) => r.textContent));
  return { call, pane, baselines, rows };
}

test("a coder change shows coder::change-diff's bodies, and its new body becomes the baseline", async () => {
  const { call, pane, baselines, rows } = mount({
    "coder::read-file": { content: "world\n", is_utf8: true, revision: "chg-1" },
    "coder::change-diff": { old_contents: "hello\n", new_contents: "world\n", is_binary: false },
  });
  await pane.written("/w/src/a.rs", "modified");
  assert.deepEqual(call.calls, [["coder::read-file", { path: "/w/src/a.rs" }], ["coder::change-diff", { change_id: "chg-1" }]]);
  assert.equal(byTestId(pane.el, "diff-path").textContent, "src/a.rs");
  assert.equal(pane.el.childNodes[0].textContent, "Diff src/a.rs (coder::change-diff)");
  assert.deepEqual(rows(), ["-hello", "+world"]);
  assert.equal(baselines.get("/w/src/a.rs"), "world\n");
});

test("without a change record: the diff against the baseline; a repeated event keeps the diff", async () => {
  let body = "two\n";
  const baselines = createBaselines();
  baselines.remember("/w/a.txt", "one\n");
  const { pane, rows } = mount({ "coder::read-file": () => ({ content: body, is_utf8: true, revision: "r" }), "coder::change-diff": fail("C210", "unknown change") }, baselines);
  await pane.written("/w/a.txt", "modified");
  assert.deepEqual(rows(), ["-one", "+two"]);
  assert.equal(byTestId(pane.el, "diff-stats").textContent, "+1 −1");
  await pane.written("/w/a.txt", "modified");
  assert.deepEqual(rows(), ["-one", "+two"]);
  body = "three\n";
  await pane.written("/w/a.txt", "modified");
  assert.deepEqual(rows(), ["-two", "+three"]);
});

test("a file the page never saw diffs against nothing", async () => {
  const { pane, rows } = mount({ "coder::read-file": { content: "x\n", is_utf8: true } });
  await pane.written("/w/n.txt", "created");
  assert.equal(pane.el.childNodes[0].textContent, "Diff n.txt (created)");
  assert.deepEqual(rows(), ["+x"]);
});

test("a body too large to diff says so", async () => {
  const { pane } = mount({ "coder::read-file": { content: "a".repeat(DIFF_LIMIT + 1), is_utf8: true } });
  await pane.written("/w/big", "modified");
  assert.deepEqual(pane.el.childNodes.map((e) => e.textContent), ["Diff big", "too large to diff here"]);
});

test("a file gone before it is read leaves the view as it was", async () => {
  const { pane } = mount({ "coder::read-file": fail("C204", "gone") });
  const before = pane.el.textContent;
  await pane.written("/w/x", "modified");
  assert.equal(pane.el.textContent, before);
});

test("a later write takes the view; the earlier file's body still becomes its baseline", async () => {
  const slow = deferred();
  const { pane, baselines, rows } = mount({ "coder::read-file": (p) => (p.path === "/w/a" ? slow.promise : { content: "b\n", is_utf8: true }) });
  const first = pane.written("/w/a", "modified");
  await pane.written("/w/b", "created");
  slow.resolve({ content: "a body\n", is_utf8: true });
  await first;
  await settle();
  assert.equal(byTestId(pane.el, "diff-path").textContent, "b");
  assert.deepEqual(rows(), ["+b"]);
  assert.equal(baselines.get("/w/a"), "a body\n");
});

test("a later write of the same file keeps the old baseline for its own diff", async () => {
  const slow = deferred();
  let n = 0;
  const baselines = createBaselines();
  baselines.remember("/w/a", "v0\n");
  const { pane, rows } = mount({ "coder::read-file": () => (++n === 1 ? slow.promise : { content: "v2\n", is_utf8: true }) }, baselines);
  const first = pane.written("/w/a", "modified");
  await pane.written("/w/a", "modified");
  slow.resolve({ content: "v1\n", is_utf8: true });
  await first;
  assert.deepEqual(rows(), ["-v0", "+v2"]);
  assert.equal(baselines.get("/w/a"), "v2\n");
});
