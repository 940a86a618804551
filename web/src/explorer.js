// The file tree (coder::list-folder): folders first, then by name; a click on a folder
// expands or collapses it, a click on a file opens it. It is rebuilt whole on every refresh
// (the change feed asks for one), and only the newest refresh lands.
import { h, clear, errorText } from "./dom.js";
import { join } from "./paths.js";

// Entries asked for per coder::list-folder page, and most pages read for one folder.
const PAGE_SIZE = 500;
const PAGES_MAX = 49;
// Deepest expanded folder shown (deeper ones stay closed).
const DEPTH_MAX = 32;

// Folders first, then by name (locale order). Sorts in place and returns `entries`.
export function sortEntries(entries) {
  return entries.sort((a, b) => ((a.kind === "dir") !== (b.kind === "dir") ? (a.kind === "dir" ? -1 : 1) : a.name.localeCompare(b.name)));
}

// Every entry of `dir`, page by page (at most PAGES_MAX pages), sorted.
export async function listDir(call, dir) {
  const out = [];
  for (let page = 1; page <= PAGES_MAX; page++) {
    const r = await call("coder::list-folder", { path: dir, page, page_size: PAGE_SIZE });
    out.push(...r.entries);
    if (!r.has_more) break;
  }
  return sortEntries(out);
}

// What one tree row shows: its class, indentation and label.
export function treeRow({ name, isDir, open, selected, depth }) {
  return {
    class: `shell-tree-entry${isDir ? " shell-tree-dir" : ""}${selected ? " shell-selected" : ""}`,
    style: `padding-left:${depth * 12 + 4}px`,
    label: `${isDir ? (open ? "▾ " : "▸ ") : ""}${name}`,
  };
}

// ctx: {call(fid, payload), root() -> workspace or null, openPath() -> the open file,
// onOpenFile(path, {size})}.
export function createExplorer(ctx) {
  const el = h("div", { class: "shell-tree", "data-testid": "tree" });
  const expanded = new Set();
  let gen = 0;

  async function refresh() {
    const root = ctx.root();
    if (!root) return;
    const mine = ++gen;
    const list = h("ul", { class: "shell-tree-list" });
    try {
      await fill(list, root, 0);
    } catch (e) {
      list.append(h("li", { class: "shell-error", text: errorText(e) }));
    }
    if (mine !== gen) return;
    clear(el);
    el.append(list);
  }

  function toggle(path) {
    if (expanded.has(path)) expanded.delete(path);
    else expanded.add(path);
    refresh();
  }

  async function fill(ul, dir, depth) {
    const entries = await listDir(ctx.call, dir);
    for (const e of entries) {
      const path = join(dir, e.name);
      const isDir = e.kind === "dir";
      const row = treeRow({ name: e.name, isDir, open: expanded.has(path), selected: path === ctx.openPath(), depth });
      const label = h(
        "div",
        {
          class: row.class,
          "data-path": path,
          "data-testid": "tree-entry",
          style: row.style,
          onclick: () => (isDir ? toggle(path) : ctx.onOpenFile(path, { size: e.size })),
        },
        row.label,
      );
      const li = h("li", {}, label);
      ul.append(li);
      if (isDir && expanded.has(path) && depth < DEPTH_MAX) {
        const sub = h("ul", { class: "shell-tree-list" });
        li.append(sub);
        await fill(sub, path, depth + 1);
      }
    }
  }

  // A new workspace: every folder closed.
  function reset() {
    expanded.clear();
  }

  return { el, refresh, reset };
}
