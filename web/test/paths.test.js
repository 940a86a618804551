import { test } from "node:test";
import assert from "node:assert/strict";
import { isNoise, relative, join, parent, imageType, language } from "../src/paths.js";

test("relative: a path under the root, the root itself, and one outside", () => {
  assert.equal(relative("/w", "/w/a/b.rs"), "a/b.rs");
  assert.equal(relative("/w/", "/w/a"), "a");
  assert.equal(relative("/w", "/w"), "");
  assert.equal(relative("/w", "/wx/a"), null);
  assert.equal(relative("/w", "/other"), null);
  assert.equal(relative("/", "/etc/hosts"), "etc/hosts");
});

test("join and parent", () => {
  assert.equal(join("/w", "a"), "/w/a");
  assert.equal(join("/w/", "a"), "/w/a");
  assert.equal(join("/", "etc"), "/etc");
  assert.equal(parent("/w/a/b"), "/w/a");
  assert.equal(parent("/w"), "/");
  assert.equal(parent("/"), "/");
  assert.equal(parent("relative"), "/");
});

test("isNoise: hidden segments, noise folders at any depth, temp and build files", () => {
  const root = "/w";
  for (const p of ["/w/.git/index", "/w/src/.hidden", "/w/target/debug/x", "/w/a/node_modules/m/i.js", "/w/dist/page.js", "/w/build/o", "/w/out/x", "/w/__pycache__/m.pyc", "/w/.cache/x", "/w/.next/x"]) {
    assert.equal(isNoise(root, p), true, p);
  }
  for (const p of ["/w/a.rs~", "/w/a.swp", "/w/a.tmp", "/w/a.tmp.1f2e", "/w/Cargo.lock", "/w/m.pyc", "/w/m.o", "/w/x.tmp.part"]) {
    assert.equal(isNoise(root, p), true, p);
  }
  for (const p of ["/w/src/lib.rs", "/w/README.md", "/w/targets/x.rs", "/w/distance.txt", "/w/m.old"]) {
    assert.equal(isNoise(root, p), false, p);
  }
  // Outside the workspace is never shown.
  assert.equal(isNoise(root, "/elsewhere/a.rs"), true);
});

test("imageType: by extension, any case", () => {
  assert.equal(imageType("/w/a.png"), "image/png");
  assert.equal(imageType("/w/a.JPG"), "image/jpeg");
  assert.equal(imageType("/w/a.jpeg"), "image/jpeg");
  assert.equal(imageType("/w/favicon.ico"), "image/x-icon");
  assert.equal(imageType("/w/a.svg"), null);
  assert.equal(imageType("/w/png"), null);
});

test("language: by extension, and the well-known file names", () => {
  assert.equal(language("/w/src/lib.rs"), "rust");
  assert.equal(language("/w/a.TSX"), "typescript");
  assert.equal(language("/w/Cargo.toml"), "ini");
  assert.equal(language("/w/Makefile"), "makefile");
  assert.equal(language("/w/Dockerfile"), "dockerfile");
  assert.equal(language("/w/x.patch"), "diff");
  assert.equal(language("/w/README"), null);
  assert.equal(language("/w/a.unknown"), null);
});
