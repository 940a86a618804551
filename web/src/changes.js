// The live change feed: a `shell::changed` binding on the workspace (include_ignored, so the
// tree sees ignored files too) delivered to a browser-side function, and what each event does.
import { isNoise, join } from "./paths.js";

// The browser-side function the worker calls with each change.
export const CHANGED_FN = "iii::shell-ui::changed";

// The shell::changed binding's config for a workspace.
export function changedConfig(root) {
  return { path: root, include_ignored: true };
}

// What a change event means for a page showing workspace `root` with `openPath` open:
//   null                                  not this workspace's (ignored);
//   {refresh: true, file, diff}           refresh the tree, turns and sessions, and
//     file: {path, missing} | null        re-show the open file (missing when it was deleted),
//     diff: {path, kind} | null           show the written file as the diff.
// Change paths are relative to the watched root; an overflow, a folder event or the root
// itself only refreshes.
export function routeChange(ev, root, openPath) {
  if (!root || !ev || ev.root !== root) return null;
  const out = { refresh: true, file: null, diff: null };
  if (ev.overflow || ev.dir || !ev.path || ev.path === ".") return out;
  const path = join(ev.root, ev.path);
  if (path === openPath) out.file = { path, missing: ev.kind === "deleted" };
  if (ev.kind !== "deleted" && !isNoise(root, path)) out.diff = { path, kind: ev.kind };
  return out;
}
