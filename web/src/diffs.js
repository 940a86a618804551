// The diff of the last written file: coder::change-diff when a coder::* call wrote it (the
// read-file answer names its revision), else against the body the page last saw (the
// baselines). Only the newest change renders; every body read still moves the baseline.
import { h, clear } from "./dom.js";
import { relative } from "./paths.js";
import { renderDiff } from "./diffview.js";
import { DIFF_LIMIT } from "./baselines.js";

// The view for a coder::change-diff answer.
export function changeView(path, d) {
  return { path, oldText: d.old_contents, newText: d.new_contents, isBinary: d.is_binary, source: "coder::change-diff" };
}

// The view against the page's baseline for a read-file answer `r`, or null when there is
// nothing new to show (a second event for a write already shown: rename and close come apart).
// An atomic replace (rename over the file) reports `created`: a body the page has seen is still
// the baseline; only a file it never saw diffs against nothing.
export function baselineView(path, r, kind, seen, baseline) {
  const text = r.content ?? "";
  if (seen && baseline === text) return null;
  return { path, oldText: seen ? baseline : "", newText: text, isBinary: r.is_utf8 === false, source: seen ? "since last seen" : kind === "created" ? "created" : "new to this page" };
}

// Whether a view is too large to diff in the page.
export function tooLarge(view) {
  return (view.oldText ?? "").length + (view.newText ?? "").length > DIFF_LIMIT;
}

// ctx: {call(fid, payload), root() -> workspace or null, baselines}.
export function createDiffPane(ctx) {
  const el = h("section", { class: "shell-diff", "data-testid": "diff-view" }, h("div", { class: "shell-muted", text: "the last written file shows here as a diff" }));
  const { baselines } = ctx;
  let lastWritten = null;
  let gen = 0;
  const shown = (path) => relative(ctx.root() || "", path) ?? path;

  // `path` was just written (a change event of `kind`, or a revert): it takes the view.
  async function written(path, kind) {
    lastWritten = path;
    const mine = ++gen;
    try {
      const r = await ctx.call("coder::read-file", { path });
      if (mine !== gen || lastWritten !== path) {
        // A later change took the view; this body is still the page's newest sight of the file.
        // (Not when the newer change is to this same file: its own diff needs the old baseline.)
        if (r.is_utf8 !== false && lastWritten !== path) baselines.remember(path, r.content ?? "");
        return;
      }
      let view = null;
      if (r.revision) {
        try {
          view = changeView(path, await ctx.call("coder::change-diff", { change_id: r.revision }));
        } catch {
          /* not a coder change: fall back to the page's baseline */
        }
      }
      if (!view) view = baselineView(path, r, kind, baselines.has(path), baselines.get(path));
      if (!view) return;
      if (mine !== gen) {
        // A later change took the view while this diff was fetched: as above, this body is
        // still the page's newest sight of the file, and the baseline of its next diff.
        if (!view.isBinary && lastWritten !== path) baselines.remember(path, view.newText ?? "");
        return;
      }
      if (!view.isBinary) baselines.remember(path, view.newText ?? "");
      if (tooLarge(view)) {
        clear(el);
        el.append(h("div", { class: "shell-pane-title", text: `Diff ${shown(path)}` }), h("div", { class: "shell-muted", text: "too large to diff here" }));
        return;
      }
      renderDiff(el, { ...view, path: shown(path) });
    } catch {
      /* the file went away again */
    }
  }

  return { el, written };
}
