// The file view: text through coder::read-file (highlighted), large files and images through
// shell::workspace::read-bytes in chunks. Only the newest request renders.
import { h, clear, errorText, base64ToBytes } from "./dom.js";
import { relative, imageType, language } from "./paths.js";
import { highlight } from "./highlight.js";

// Read through coder::read-file up to this size; above it (and for images) in chunks.
export const TEXT_LIMIT = 1024 * 1024;
export const CHUNK = 1024 * 1024;
// Most read in chunks for one view.
export const CHUNKED_LIMIT = 16 * 1024 * 1024;

// One byte array of `parts`, in order.
export function concat(parts) {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

// Reads `path` in CHUNK-sized pieces until its end, an empty piece, or `limit` bytes.
// Returns the pieces, the bytes read and the file's size.
export async function readChunks(call, path, limit) {
  const parts = [];
  let offset = 0;
  let size;
  for (;;) {
    const r = await call("shell::workspace::read-bytes", { path, offset, length: CHUNK });
    const bytes = base64ToBytes(r.content);
    parts.push(bytes);
    offset += bytes.length;
    size = r.size;
    if (r.eof || bytes.length === 0 || offset >= limit) break;
  }
  return { parts, read: offset, size };
}

// How a file is read: `image` (chunks, shown as an image), `chunks` (a large text file) or
// `text` (one coder::read-file).
export function readMode(path, size) {
  const img = imageType(path);
  if (img) return { kind: "image", type: img };
  if ((size ?? 0) > TEXT_LIMIT) return { kind: "chunks" };
  return { kind: "text" };
}

// ctx: {call(fid, payload), root() -> workspace or null, baselines, onOpen(path) when the
// open file changes to another one}.
export function createFileView(ctx) {
  const el = h("section", { class: "shell-file", "data-testid": "file-view" }, h("div", { class: "shell-muted", text: "open a file from the tree" }));
  let openPath = null;
  let gen = 0;

  // Shows `path`; opts.size (from the tree) picks chunked reads, opts.missing shows it deleted.
  async function show(path, opts = {}) {
    const mine = ++gen;
    if (openPath !== path) ctx.onOpen(path);
    openPath = path;
    const title = h("div", { class: "shell-pane-title" }, h("code", { "data-testid": "file-path", text: relative(ctx.root() || "", path) ?? path }));
    const body = h("div", { class: "shell-file-body" });
    const render = () => {
      if (mine !== gen) return;
      clear(el);
      el.append(title, body);
    };
    if (opts.missing) {
      body.append(h("div", { class: "shell-muted", text: "deleted" }));
      return render();
    }
    try {
      const mode = readMode(path, opts.size);
      if (mode.kind === "text") await showText(path, body);
      else await showChunks(path, mode, body);
    } catch (e) {
      body.append(h("div", { class: "shell-error", text: errorText(e) }));
    }
    render();
  }

  async function showChunks(path, mode, body) {
    const { parts, read, size } = await readChunks(ctx.call, path, CHUNKED_LIMIT);
    if (mode.kind === "image") {
      const url = URL.createObjectURL(new Blob(parts, { type: mode.type }));
      body.append(h("img", { class: "shell-image", src: url, "data-testid": "file-image", alt: path }));
      return;
    }
    const text = new TextDecoder().decode(concat(parts));
    body.append(h("div", { class: "shell-muted", text: `showing ${read} of ${size} bytes (read in ${parts.length} chunks)` }));
    body.append(h("pre", { class: "shell-code" }, h("code", { "data-testid": "file-content", text })));
  }

  async function showText(path, body) {
    const r = await ctx.call("coder::read-file", { path });
    if (r.is_utf8 === false) {
      body.append(h("div", { class: "shell-muted", text: `binary file, ${r.size ?? "?"} bytes` }));
      return;
    }
    const text = r.content ?? "";
    // The diff view owns the baseline once it has one (it moves it on every change it shows).
    if (!ctx.baselines.has(path)) ctx.baselines.remember(path, text);
    const code = h("code", { class: "hljs", "data-testid": "file-content" });
    code.innerHTML = highlight(text, language(path));
    body.append(h("pre", { class: "shell-code" }, code));
  }

  return { el, show, openPath: () => openPath };
}
