import { test } from "node:test";
import assert from "node:assert/strict";
import { fakeHost } from "../testkit/fakeengine.js";
import { browserFid, createTransport, createFanout } from "../src/transport.js";

test("browserFid: the name and the browser's id", () => {
  assert.equal(browserFid("iii::shell-ui::changed", "console-1"), "iii::shell-ui::changed::console-1");
});

test("the transport goes through host.iii: calls, browser functions and bindings", async () => {
  const host = fakeHost({ "shell::workspace::roots": { roots: ["/w"] } }, "console-7");
  const io = createTransport(host.iii);
  assert.deepEqual(await io.call("shell::workspace::roots", {}), { roots: ["/w"] });
  assert.deepEqual(host.calls.calls, [["shell::workspace::roots", {}]]);
  assert.equal(io.fid("iii::shell-ui::pty-output"), "iii::shell-ui::pty-output::console-7");
  const off = io.on("iii::shell-ui::changed", () => {});
  assert.deepEqual([...host.functions.keys()], ["iii::shell-ui::changed"]);
  off();
  assert.equal(host.functions.size, 0);
  const unbind = io.bind("shell::changed", "f::console-7", { path: "/w", include_ignored: true });
  assert.deepEqual(host.bindings, [{ type: "shell::changed", function_id: "f::console-7", config: { path: "/w", include_ignored: true }, bound: true }]);
  unbind();
  assert.equal(host.bindings[0].bound, false);
});

test("a fan-out hands each event to every listener still subscribed", () => {
  const fan = createFanout();
  const a = [];
  const b = [];
  const offA = fan.add((ev) => a.push(ev));
  fan.add((ev) => b.push(ev));
  fan.emit(1);
  offA();
  fan.emit(2);
  assert.deepEqual(a, [1]);
  assert.deepEqual(b, [1, 2]);
  assert.equal(fan.size, 1);
});
