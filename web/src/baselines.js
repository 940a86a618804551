// The diff baselines: per path, the text the page last saw of the file (what its next diff is
// taken against when the worker has no change record). Bounded: at most `limit` paths, the
// least recently seen forgotten first, and no body over `maxText` characters.

// Most baselines the page keeps.
export const SEEN_LIMIT = 256;
// Bodies larger than this (old + new) are not diffed in the page, and none is kept as a baseline.
export const DIFF_LIMIT = 2 * 1024 * 1024;

export function createBaselines({ limit = SEEN_LIMIT, maxText = DIFF_LIMIT } = {}) {
  const seen = new Map(); // path -> text, newest last
  return {
    has: (path) => seen.has(path),
    get: (path) => seen.get(path),
    // `text` becomes the baseline of `path`; a non-string or oversized body forgets it.
    remember(path, text) {
      seen.delete(path);
      if (typeof text !== "string" || text.length > maxText) return;
      seen.set(path, text);
      while (seen.size > limit) seen.delete(seen.keys().next().value);
    },
    paths: () => [...seen.keys()],
  };
}
