// Pure helpers about paths (no DOM), kept apart so they are easy to reason about.

const NOISE = new Set(["target", "node_modules", "dist", "build", "out", ".git", "__pycache__", ".cache", ".next"]);

// True when a change to `path` (absolute, under `root`) must never take over the diff view:
// hidden segments, noise directories at any depth, build/temp artifacts.
export function isNoise(root, path) {
  const rel = relative(root, path);
  if (rel === null) return true;
  const segs = rel.split("/").filter(Boolean);
  if (segs.some((s) => s.startsWith(".") || NOISE.has(s))) return true;
  const name = segs[segs.length - 1] || "";
  return /(~|\.swp|\.tmp|\.tmp\.[0-9a-f]+|\.lock|\.pyc|\.o)$/.test(name) || name.includes(".tmp.");
}

export function relative(root, path) {
  if (path === root) return "";
  const base = root.endsWith("/") ? root : root + "/";
  return path.startsWith(base) ? path.slice(base.length) : null;
}

export function join(dir, name) {
  return dir.endsWith("/") ? dir + name : dir + "/" + name;
}

export function parent(path) {
  const i = path.lastIndexOf("/");
  return i <= 0 ? "/" : path.slice(0, i);
}

const IMAGE = { png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", gif: "image/gif", webp: "image/webp", bmp: "image/bmp", ico: "image/x-icon" };

export function imageType(path) {
  const ext = (path.split(".").pop() || "").toLowerCase();
  return IMAGE[ext] || null;
}

const LANG = {
  rs: "rust", js: "javascript", mjs: "javascript", cjs: "javascript", ts: "typescript", tsx: "typescript",
  jsx: "javascript", json: "json", py: "python", sh: "bash", bash: "bash", toml: "ini", ini: "ini",
  yaml: "yaml", yml: "yaml", md: "markdown", css: "css", html: "xml", xml: "xml", svg: "xml",
  go: "go", c: "c", h: "c", cpp: "cpp", hpp: "cpp", java: "java", sql: "sql", diff: "diff", patch: "diff",
};

export function language(path) {
  const name = path.split("/").pop() || "";
  if (name === "Makefile") return "makefile";
  if (name === "Dockerfile") return "dockerfile";
  const ext = (name.includes(".") ? name.split(".").pop() : "").toLowerCase();
  return LANG[ext] || null;
}
