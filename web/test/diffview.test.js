import { test } from "node:test";
import assert from "node:assert/strict";
import { findAll, byTestId, texts } from "../testkit/fakedom.js";
import { h } from "../src/dom.js";
import { diffRows, renderDiff } from "../src/diffview.js";

test("diffRows: kept, removed and added lines, in order", () => {
  assert.deepEqual(diffRows("a\nb\nc\n", "a\nB\nc\nd\n"), [
    { kind: "same", text: "a" },
    { kind: "del", text: "b" },
    { kind: "add", text: "B" },
    { kind: "same", text: "c" },
    { kind: "add", text: "d" },
  ]);
  assert.deepEqual(diffRows(undefined, "x"), [{ kind: "add", text: "x" }]);
  assert.deepEqual(diffRows("", ""), []);
  // An empty line is a row of its own.
  assert.deepEqual(diffRows("", "\n\n"), [{ kind: "add", text: "" }, { kind: "add", text: "" }]);
});

test("renderDiff: the title, the +/− counts and one row per line", () => {
  const el = h("section", {}, h("div", { text: "placeholder" }));
  renderDiff(el, { path: "src/a.rs", oldText: "a\nb\n", newText: "a\nc\n", source: "since last seen", isBinary: false });
  assert.equal(byTestId(el, "diff-path").textContent, "src/a.rs");
  assert.equal(el.childNodes[0].textContent, "Diff src/a.rs (since last seen)");
  assert.equal(byTestId(el, "diff-stats").textContent, "+1 −1");
  const rows = byTestId(el, "diff-rows").childNodes;
  assert.deepEqual(rows.map((r) => [r.className, r.textContent]), [
    ["shell-diff-same", " a"],
    ["shell-diff-del", "-b"],
    ["shell-diff-add", "+c"],
  ]);
  assert.equal(findAll(el, (e) => e.textContent === "placeholder").length, 0);
});

test("renderDiff: a binary file shows no rows", () => {
  const el = h("section");
  renderDiff(el, { path: "a.bin", oldText: "", newText: "", source: "created", isBinary: true });
  assert.deepEqual(texts(el.childNodes), ["Diff a.bin (created)", "binary file: no text diff"]);
});
