import { test } from "node:test";
import assert from "node:assert/strict";
import { CHANGED_FN, changedConfig, routeChange } from "../src/changes.js";

test("the binding: the workspace, ignored files included", () => {
  assert.equal(CHANGED_FN, "iii::shell-ui::changed");
  assert.deepEqual(changedConfig("/w"), { path: "/w", include_ignored: true });
});

test("an event of another workspace, or with no workspace open, does nothing", () => {
  assert.equal(routeChange({ root: "/other", path: "a", kind: "modified" }, "/w", null), null);
  assert.equal(routeChange({ root: "/w", path: "a", kind: "modified" }, null, null), null);
  assert.equal(routeChange(null, "/w", null), null);
});

test("an overflow, a folder or the root itself only refreshes", () => {
  const only = { refresh: true, file: null, diff: null };
  assert.deepEqual(routeChange({ root: "/w", overflow: true }, "/w", "/w/a"), only);
  assert.deepEqual(routeChange({ root: "/w", path: "src", dir: true, kind: "created" }, "/w", "/w/a"), only);
  assert.deepEqual(routeChange({ root: "/w", path: ".", kind: "modified" }, "/w", null), only);
  assert.deepEqual(routeChange({ root: "/w", kind: "modified" }, "/w", null), only);
});

test("a written file becomes the diff; the open one is shown again", () => {
  assert.deepEqual(routeChange({ root: "/w", path: "src/a.rs", kind: "modified" }, "/w", "/w/src/a.rs"), {
    refresh: true,
    file: { path: "/w/src/a.rs", missing: false },
    diff: { path: "/w/src/a.rs", kind: "modified" },
  });
  assert.deepEqual(routeChange({ root: "/w", path: "b.rs", kind: "created" }, "/w", "/w/src/a.rs"), {
    refresh: true,
    file: null,
    diff: { path: "/w/b.rs", kind: "created" },
  });
});

test("a deleted file shows as deleted if open, and never takes the diff", () => {
  assert.deepEqual(routeChange({ root: "/w", path: "a.rs", kind: "deleted" }, "/w", "/w/a.rs"), { refresh: true, file: { path: "/w/a.rs", missing: true }, diff: null });
  assert.deepEqual(routeChange({ root: "/w", path: "a.rs", kind: "deleted" }, "/w", null), { refresh: true, file: null, diff: null });
});

test("noise refreshes (and re-shows an open noise file) but never takes the diff", () => {
  assert.deepEqual(routeChange({ root: "/w", path: "target/debug/x", kind: "modified" }, "/w", null), { refresh: true, file: null, diff: null });
  assert.deepEqual(routeChange({ root: "/w", path: ".git/HEAD", kind: "modified" }, "/w", "/w/.git/HEAD"), { refresh: true, file: { path: "/w/.git/HEAD", missing: false }, diff: null });
});
