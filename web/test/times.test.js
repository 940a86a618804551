// The times are shown in the browser's time zone: these run in UTC.
process.env.TZ = "UTC";
import { test } from "node:test";
import assert from "node:assert/strict";
import { fullTime, shortTime } from "../src/times.js";

const at = Date.UTC(2026, 0, 2, 3, 4, 5);

test("fullTime: YYYY-MM-DD HH:MM:SS, unknown for what is not a time", () => {
  assert.equal(fullTime(at), "2026-01-02 03:04:05");
  assert.equal(fullTime(Date.UTC(2026, 11, 31, 23, 59, 59)), "2026-12-31 23:59:59");
  for (const bad of [0, -1, NaN, Infinity, "1700000000000", null, undefined]) assert.equal(fullTime(bad), "unknown", String(bad));
});

test("shortTime: the time alone on the same day, else the date and minutes", () => {
  assert.equal(shortTime(at, Date.UTC(2026, 0, 2, 23, 0, 0)), "03:04:05");
  assert.equal(shortTime(at, Date.UTC(2026, 0, 3, 0, 0, 1)), "2026-01-02 03:04");
  assert.equal(shortTime(0, at), "unknown");
});
