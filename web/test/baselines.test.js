import { test } from "node:test";
import assert from "node:assert/strict";
import { createBaselines, SEEN_LIMIT, DIFF_LIMIT } from "../src/baselines.js";

test("the limits", () => {
  assert.equal(SEEN_LIMIT, 256);
  assert.equal(DIFF_LIMIT, 2 * 1024 * 1024);
});

test("remember keeps the newest body per path", () => {
  const b = createBaselines();
  assert.equal(b.has("/w/a"), false);
  b.remember("/w/a", "one");
  b.remember("/w/a", "two");
  assert.equal(b.get("/w/a"), "two");
  b.remember("/w/e", "");
  assert.equal(b.has("/w/e"), true);
  assert.equal(b.get("/w/e"), "");
});

test("a body that is not text, or too large, forgets the path's baseline", () => {
  const b = createBaselines({ maxText: 4 });
  b.remember("/w/a", "abcd");
  assert.equal(b.get("/w/a"), "abcd");
  b.remember("/w/a", "abcde");
  assert.equal(b.has("/w/a"), false);
  b.remember("/w/b", "x");
  b.remember("/w/b", undefined);
  assert.equal(b.has("/w/b"), false);
});

test("past the limit the least recently seen path goes first", () => {
  const b = createBaselines({ limit: 3 });
  for (const p of ["a", "b", "c"]) b.remember(p, p);
  b.remember("a", "a2"); // seen again: now the newest
  b.remember("d", "d");
  assert.deepEqual(b.paths(), ["c", "a", "d"]);
  b.remember("e", "e");
  assert.deepEqual(b.paths(), ["a", "d", "e"]);
  const full = createBaselines();
  for (let i = 0; i < SEEN_LIMIT + 10; i++) full.remember(`/w/${i}`, "x");
  assert.equal(full.paths().length, SEEN_LIMIT);
  assert.equal(full.paths()[0], "/w/10");
});
