import { test } from "node:test";
import assert from "node:assert/strict";
import { byTestIdAll, findAll, settle } from "../testkit/fakedom.js";
import { fakeCall, fail, deferred } from "../testkit/fakeengine.js";
import { sortEntries, listDir, treeRow, createExplorer } from "../src/explorer.js";

test("sortEntries: folders first, then by name", () => {
  const got = sortEntries([
    { name: "b.rs", kind: "file" },
    { name: "src", kind: "dir" },
    { name: "a.rs", kind: "file" },
    { name: "docs", kind: "dir" },
  ]);
  assert.deepEqual(got.map((e) => e.name), ["docs", "src", "a.rs", "b.rs"]);
});

test("listDir: every page until has_more is false, 500 at a time", async () => {
  const call = fakeCall({
    "coder::list-folder": (p) => ({ entries: [{ name: `f${p.page}`, kind: "file" }], has_more: p.page < 3 }),
  });
  assert.deepEqual((await listDir(call, "/w")).map((e) => e.name), ["f1", "f2", "f3"]);
  assert.deepEqual(call.to("coder::list-folder"), [
    { path: "/w", page: 1, page_size: 500 },
    { path: "/w", page: 2, page_size: 500 },
    { path: "/w", page: 3, page_size: 500 },
  ]);
});

test("listDir: at most 49 pages of a folder that never ends", async () => {
  const call = fakeCall({ "coder::list-folder": () => ({ entries: [], has_more: true }) });
  await listDir(call, "/w");
  assert.equal(call.calls.length, 49);
});

test("treeRow: class, indent and label", () => {
  assert.deepEqual(treeRow({ name: "src", isDir: true, open: false, selected: false, depth: 0 }), { class: "shell-tree-entry shell-tree-dir", style: "padding-left:4px", label: "▸ src" });
  assert.deepEqual(treeRow({ name: "src", isDir: true, open: true, selected: false, depth: 2 }), { class: "shell-tree-entry shell-tree-dir", style: "padding-left:28px", label: "▾ src" });
  assert.deepEqual(treeRow({ name: "a.rs", isDir: false, open: false, selected: true, depth: 1 }), { class: "shell-tree-entry shell-selected", style: "padding-left:16px", label: "a.rs" });
});

const fs = {
  "/w": [{ name: "src", kind: "dir" }, { name: "README.md", kind: "file", size: 7 }],
  "/w/src": [{ name: "lib.rs", kind: "file", size: 17 }],
};
const listing = (p) => (fs[p.path] ? { entries: fs[p.path], has_more: false } : Promise.reject({ code: "C204", message: `not found: ${p.path}` }));
const rows = (tree) => byTestIdAll(tree.el, "tree-entry").map((e) => [e.getAttribute("data-path"), e.textContent, e.className]);

test("the tree lists the workspace, expands a folder on a click and opens a file on a click", async () => {
  const opened = [];
  let open = "/w/README.md";
  const tree = createExplorer({ call: fakeCall({ "coder::list-folder": listing }), root: () => "/w", openPath: () => open, onOpenFile: (p, o) => opened.push([p, o]) });
  await tree.refresh();
  assert.deepEqual(rows(tree), [
    ["/w/src", "▸ src", "shell-tree-entry shell-tree-dir"],
    ["/w/README.md", "README.md", "shell-tree-entry shell-selected"],
  ]);
  byTestIdAll(tree.el, "tree-entry")[0].click();
  await settle();
  assert.deepEqual(rows(tree), [
    ["/w/src", "▾ src", "shell-tree-entry shell-tree-dir"],
    ["/w/src/lib.rs", "lib.rs", "shell-tree-entry"],
    ["/w/README.md", "README.md", "shell-tree-entry shell-selected"],
  ]);
  assert.equal(byTestIdAll(tree.el, "tree-entry")[1].getAttribute("style"), "padding-left:16px");
  byTestIdAll(tree.el, "tree-entry")[1].click();
  assert.deepEqual(opened, [["/w/src/lib.rs", { size: 17 }]]);
  // A new workspace starts with every folder closed.
  tree.reset();
  open = null;
  await tree.refresh();
  assert.deepEqual(rows(tree).map((r) => r[1]), ["▸ src", "README.md"]);
});

test("a listing that fails shows its error in the tree", async () => {
  const tree = createExplorer({ call: fakeCall({ "coder::list-folder": fail("C204", "gone") }), root: () => "/w", openPath: () => null, onOpenFile: () => {} });
  await tree.refresh();
  assert.deepEqual(findAll(tree.el, (e) => e.className === "shell-error").map((e) => e.textContent), ["C204: gone"]);
});

test("no workspace: nothing is listed; an older refresh that ends last does not land", async () => {
  let root = null;
  const slow = deferred();
  let n = 0;
  const call = fakeCall({ "coder::list-folder": (p) => (++n === 1 ? slow.promise : listing(p)) });
  const tree = createExplorer({ call, root: () => root, openPath: () => null, onOpenFile: () => {} });
  await tree.refresh();
  assert.equal(call.calls.length, 0);
  root = "/w";
  const first = tree.refresh();
  await tree.refresh();
  slow.resolve({ entries: [{ name: "stale", kind: "file" }], has_more: false });
  await first;
  assert.deepEqual(rows(tree).map((r) => r[1]), ["▸ src", "README.md"]);
});
