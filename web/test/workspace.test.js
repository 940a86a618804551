import { test } from "node:test";
import assert from "node:assert/strict";
import { byTestId, byTestIdAll, texts, settle } from "../testkit/fakedom.js";
import { fakeCall, fail } from "../testkit/fakeengine.js";
import { h } from "../src/dom.js";
import { createWorkspacePicker } from "../src/workspace.js";

function mount(routes) {
  const call = fakeCall(routes);
  const picked = [];
  const picker = createWorkspacePicker({ call, onPick: (r) => picked.push(r) });
  const page = h("div", {}, h("header", {}, ...picker.bar), picker.choices);
  return { call, picked, picker, page };
}

const routes = {
  "shell::workspace::roots": { roots: ["/srv", "/home/u"] },
  "shell::workspace::list": (p) => ({ path: p.path.replace(/\/$/, ""), entries: [{ name: "proj", path: `${p.path}/proj` }] }),
  "shell::workspace::validate": (p) => ({ path: p.path }),
};

test("the roots show as choices; one click browses into a root", async () => {
  const { call, picker, page } = mount(routes);
  await picker.showRoots();
  assert.deepEqual(texts(byTestIdAll(page, "ws-root")), ["/srv", "/home/u"]);
  byTestIdAll(page, "ws-root")[1].click();
  await settle();
  assert.deepEqual(call.to("shell::workspace::list"), [{ path: "/home/u" }]);
  assert.equal(byTestId(page, "ws-input").value, "/home/u");
  assert.deepEqual(texts(byTestIdAll(page, "ws-pick")), ["Open /home/u"]);
  assert.deepEqual(texts(byTestIdAll(page, "ws-child")), ["proj/"]);
  assert.equal(byTestIdAll(page, "ws-root").length, 0);
});

test("Browse with an empty input shows the roots; Open validates and hands the root over", async () => {
  const { call, picked, picker, page } = mount(routes);
  byTestId(page, "ws-browse").click();
  await settle();
  assert.deepEqual(call.calls, [["shell::workspace::roots", {}]]);
  byTestId(page, "ws-input").value = "/srv/proj";
  byTestId(page, "ws-open").click();
  await settle();
  assert.deepEqual(call.to("shell::workspace::validate"), [{ path: "/srv/proj" }]);
  assert.deepEqual(picked, ["/srv/proj"]);
  assert.equal(picker.choices.childNodes.length, 0);
  picker.show("/srv/proj");
  assert.equal(byTestId(page, "ws-current").textContent, "/srv/proj");
});

test("errors show with their code, and clear on the next try", async () => {
  const { picked, picker, page } = mount({
    "shell::workspace::roots": fail("S205", "no roots"),
    "shell::workspace::validate": fail("S201", "PATH_DENIED: /etc"),
    "shell::workspace::list": routes["shell::workspace::list"],
  });
  await picker.showRoots();
  assert.equal(byTestId(page, "ws-error").textContent, "roots: S205: no roots");
  await picker.pick("/etc");
  assert.equal(byTestId(page, "ws-error").textContent, "S201: PATH_DENIED: /etc");
  assert.deepEqual(picked, []);
  await picker.browse("/srv");
  assert.equal(byTestId(page, "ws-error").textContent, "");
});

test("show with input: the restored workspace is in the input too", () => {
  const { picker, page } = mount(routes);
  assert.equal(byTestId(page, "ws-current").textContent, "no workspace");
  picker.show("/w", { input: true });
  assert.equal(byTestId(page, "ws-input").value, "/w");
  assert.equal(byTestId(page, "ws-current").textContent, "/w");
});
