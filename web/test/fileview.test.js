import { test } from "node:test";
import assert from "node:assert/strict";
import { resolveObjectURL } from "node:buffer";
import { byTestId, byTestIdAll, findAll, settle } from "../testkit/fakedom.js";
import { fakeCall, fail, deferred } from "../testkit/fakeengine.js";
import { createBaselines } from "../src/baselines.js";
import { concat, readChunks, readMode, createFileView, TEXT_LIMIT, CHUNK, CHUNKED_LIMIT } from "../src/fileview.js";

test("the limits: 1 MiB text reads, 1 MiB chunks, 16 MiB per view", () => {
  assert.deepEqual([TEXT_LIMIT, CHUNK, CHUNKED_LIMIT], [1048576, 1048576, 16777216]);
});

test("concat: the parts in order", () => {
  assert.deepEqual(concat([new Uint8Array([1, 2]), new Uint8Array([]), new Uint8Array([3])]), new Uint8Array([1, 2, 3]));
  assert.deepEqual(concat([]), new Uint8Array([]));
});

test("readMode: images and large files in chunks, the rest as text", () => {
  assert.deepEqual(readMode("/w/a.png", 10), { kind: "image", type: "image/png" });
  assert.deepEqual(readMode("/w/a.txt", TEXT_LIMIT + 1), { kind: "chunks" });
  assert.deepEqual(readMode("/w/a.txt", TEXT_LIMIT), { kind: "text" });
  assert.deepEqual(readMode("/w/a.txt", undefined), { kind: "text" });
});

// A file of `size` bytes of "a", served by shell::workspace::read-bytes.
const bytesOf = (size) => (p) => {
  const n = Math.max(0, Math.min(p.length, size - p.offset));
  return { content: Buffer.alloc(n, "a").toString("base64"), size, eof: p.offset + n >= size };
};

test("readChunks: chunk by chunk to the end", async () => {
  const call = fakeCall({ "shell::workspace::read-bytes": bytesOf(2 * CHUNK + 5) });
  const r = await readChunks(call, "/w/big.txt", CHUNKED_LIMIT);
  assert.deepEqual(r.parts.map((p) => p.length), [CHUNK, CHUNK, 5]);
  assert.deepEqual([r.read, r.size], [2 * CHUNK + 5, 2 * CHUNK + 5]);
  assert.deepEqual(call.to("shell::workspace::read-bytes").map((p) => [p.path, p.offset, p.length]), [
    ["/w/big.txt", 0, CHUNK],
    ["/w/big.txt", CHUNK, CHUNK],
    ["/w/big.txt", 2 * CHUNK, CHUNK],
  ]);
});

test("readChunks: stops at the limit, and at an empty chunk", async () => {
  const huge = await readChunks(fakeCall({ "shell::workspace::read-bytes": bytesOf(10 * CHUNK) }), "/w/h", 2 * CHUNK);
  assert.deepEqual([huge.parts.length, huge.read, huge.size], [2, 2 * CHUNK, 10 * CHUNK]);
  const shrunk = await readChunks(fakeCall({ "shell::workspace::read-bytes": { content: "", size: 100, eof: false } }), "/w/s", CHUNKED_LIMIT);
  assert.deepEqual([shrunk.parts.length, shrunk.read, shrunk.size], [1, 0, 100]);
});

function mount(routes, baselines = createBaselines()) {
  const call = fakeCall(routes);
  const opened = [];
  const view = createFileView({ call, root: () => "/w", baselines, onOpen: (p) => opened.push(p) });
  return { call, opened, view, baselines };
}

test("a text file: its path, highlighted content, and the baseline when it has none", async () => {
  const { call, opened, view, baselines } = mount({ "coder::read-file": { content: "fn main() {}\n", is_utf8: true, size: 13 } });
  await view.show("/w/src/main.rs");
  assert.deepEqual(call.calls, [["coder::read-file", { path: "/w/src/main.rs" }]]);
  assert.equal(byTestId(view.el, "file-path").textContent, "src/main.rs");
  const code = byTestId(view.el, "file-content");
  assert.equal(code.className, "hljs");
  assert.equal(code.textContent, "fn main() {}\n");
  assert.match(code.innerHTML, /<span class="hljs-keyword">fn<\/span>/);
  assert.equal(baselines.get("/w/src/main.rs"), "fn main() {}\n");
  assert.deepEqual(opened, ["/w/src/main.rs"]);
  assert.equal(view.openPath(), "/w/src/main.rs");
  // Shown again: no new onOpen; the diff view's baseline is not moved.
  baselines.remember("/w/src/main.rs", "older");
  await view.show("/w/src/main.rs");
  assert.deepEqual(opened, ["/w/src/main.rs"]);
  assert.equal(baselines.get("/w/src/main.rs"), "older");
});

test("file content is text: markup in a file is never markup in the page", async () => {
  const { view } = mount({ "coder::read-file": { content: "<img src=x onerror=alert(1)>", is_utf8: true } });
  await view.show("/w/a.txt");
  assert.equal(byTestId(view.el, "file-content").innerHTML, "&lt;img src=x onerror=alert(1)&gt;");
});

test("a binary file, a deleted file and a failed read", async () => {
  const { view } = mount({ "coder::read-file": { is_utf8: false, size: 42 } });
  await view.show("/w/a.bin");
  assert.deepEqual(findAll(view.el, (e) => e.className === "shell-muted").map((e) => e.textContent), ["binary file, 42 bytes"]);
  await view.show("/w/a.bin", { missing: true });
  assert.deepEqual(view.el.childNodes.map((e) => e.textContent), ["a.bin", "deleted"]);
  const failing = mount({ "coder::read-file": fail("C204", "FILE_NOT_FOUND: /w/x") }).view;
  await failing.show("/w/x");
  assert.deepEqual(findAll(failing.el, (e) => e.className === "shell-error").map((e) => e.textContent), ["C204: FILE_NOT_FOUND: /w/x"]);
});

test("a large file is read in chunks and says how much it shows", async () => {
  const { view } = mount({ "shell::workspace::read-bytes": bytesOf(2500000) });
  await view.show("/w/big.txt", { size: 2500000 });
  assert.equal(findAll(view.el, (e) => e.className === "shell-muted")[0].textContent, "showing 2500000 of 2500000 bytes (read in 3 chunks)");
  assert.equal(byTestId(view.el, "file-content").textContent.length, 2500000);
});

test("an image is read in chunks into a blob URL", async () => {
  const png = Buffer.from([0x89, 0x50, 0x4e, 0x47]);
  const { view } = mount({ "shell::workspace::read-bytes": { content: png.toString("base64"), size: 4, eof: true } });
  await view.show("/w/dot.png");
  const img = byTestId(view.el, "file-image");
  assert.equal(img.tagName, "IMG");
  assert.equal(img.getAttribute("alt"), "/w/dot.png");
  assert.match(img.getAttribute("src"), /^blob:/);
  const blob = resolveObjectURL(img.getAttribute("src"));
  assert.equal(blob.type, "image/png");
  assert.deepEqual(Buffer.from(await blob.arrayBuffer()), png);
});

test("only the newest request renders", async () => {
  const slow = deferred();
  const { view } = mount({ "coder::read-file": (p) => (p.path === "/w/slow" ? slow.promise : { content: "fast", is_utf8: true }) });
  const first = view.show("/w/slow");
  await view.show("/w/fast");
  slow.resolve({ content: "slow", is_utf8: true });
  await first;
  await settle();
  assert.equal(byTestIdAll(view.el, "file-content")[0].textContent, "fast");
  assert.equal(view.openPath(), "/w/fast");
});
