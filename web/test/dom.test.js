import { test, mock } from "node:test";
import assert from "node:assert/strict";
import { FakeElement, FakeText } from "../testkit/fakedom.js";
import { h, clear, errorText, bytesToBase64, base64ToBytes, debounce } from "../src/dom.js";

test("h: attributes, class, text, listeners, and children (arrays one level deep, strings, nodes)", () => {
  let clicked = 0;
  const child = h("span", { text: "inner" });
  const el = h("div", { class: "a b", "data-testid": "x", title: 3, hidden: true, disabled: false, alt: null, src: undefined, onclick: () => clicked++ }, "one", [child, null, false, 2], undefined);
  assert.equal(el.tagName, "DIV");
  assert.equal(el.className, "a b");
  assert.deepEqual([...el.attributes], [["data-testid", "x"], ["title", "3"], ["hidden", ""]]);
  assert.deepEqual(el.childNodes.map((c) => c.constructor), [FakeText, FakeElement, FakeText]);
  assert.equal(el.textContent, "oneinner2");
  assert.equal(child.parentNode, el);
  el.click();
  assert.equal(clicked, 1);
  assert.equal(h("p", { text: "t" }, "u").textContent, "tu");
});

test("clear: removes every child", () => {
  const el = h("ul", {}, h("li"), h("li"), "x");
  clear(el);
  assert.equal(el.childNodes.length, 0);
  assert.equal(el.firstChild, null);
});

test("errorText: the engine's {code, message}, strings, and what has neither", () => {
  assert.equal(errorText({ code: "S201", message: "PATH_DENIED: /x" }), "S201: PATH_DENIED: /x");
  assert.equal(errorText({ message: "m" }), "m");
  assert.equal(errorText("plain"), "plain");
  assert.equal(errorText({ code: "timeout" }), 'timeout: {"code":"timeout"}');
  assert.equal(errorText(null), "unknown error");
  assert.equal(errorText(undefined), "unknown error");
});

test("base64: both ways, across the 32 KiB pieces bytesToBase64 converts at a time", () => {
  assert.equal(bytesToBase64(new TextEncoder().encode("hi\n")), "aGkK");
  assert.deepEqual([...base64ToBytes("aGkK")], [104, 105, 10]);
  assert.deepEqual([...base64ToBytes("")], []);
  assert.deepEqual([...base64ToBytes(undefined)], []);
  const big = new Uint8Array(0x8000 * 2 + 7).map((_, i) => (i * 31) % 256);
  assert.equal(bytesToBase64(big), Buffer.from(big).toString("base64"));
  assert.deepEqual(base64ToBytes(bytesToBase64(big)), big);
});

test("debounce: one call after the quiet time, with the last arguments; cancel drops it", () => {
  mock.timers.enable({ apis: ["setTimeout"] });
  try {
    const seen = [];
    const d = debounce((...a) => seen.push(a), 100);
    d(1);
    mock.timers.tick(60);
    d(2, 3);
    mock.timers.tick(99);
    assert.deepEqual(seen, []);
    mock.timers.tick(1);
    assert.deepEqual(seen, [[2, 3]]);
    d(4);
    d.cancel();
    mock.timers.tick(1000);
    assert.deepEqual(seen, [[2, 3]]);
  } finally {
    mock.timers.reset();
  }
});
