// Pure helpers about times (no DOM): how the page shows the ms-since-epoch times the worker
// sends, in the browser's own time zone.

const pad = (n) => String(n).padStart(2, "0");

// `YYYY-MM-DD HH:MM:SS`.
export function fullTime(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms <= 0) return "unknown";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// `HH:MM:SS` on the day of `now`, else `YYYY-MM-DD HH:MM`.
export function shortTime(ms, now = Date.now()) {
  const full = fullTime(ms);
  if (full === "unknown") return full;
  const today = fullTime(now).slice(0, 10);
  return full.startsWith(today) ? full.slice(11) : full.slice(0, 16);
}
