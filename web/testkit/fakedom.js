// A small stand-in for the browser's DOM, enough for the page's modules under `node --test`:
// elements with attributes, children, text, listeners and the few properties the page sets
// (className, value, hidden, innerHTML), text nodes, `document`, `window` and `localStorage`.
// Importing it installs the globals.

export class FakeNode {
  constructor() {
    this.parentNode = null;
    this.childNodes = [];
  }
  get firstChild() {
    return this.childNodes[0] ?? null;
  }
  append(...nodes) {
    for (const n of nodes) {
      const node = n instanceof FakeNode ? n : new FakeText(String(n));
      if (node.parentNode) node.parentNode.removeChild(node);
      node.parentNode = this;
      this.childNodes.push(node);
    }
  }
  removeChild(child) {
    const i = this.childNodes.indexOf(child);
    if (i < 0) throw new Error("removeChild: not a child");
    this.childNodes.splice(i, 1);
    child.parentNode = null;
    return child;
  }
  remove() {
    if (this.parentNode) this.parentNode.removeChild(this);
  }
  get textContent() {
    return this.childNodes.map((c) => c.textContent).join("");
  }
  set textContent(v) {
    for (const c of this.childNodes) c.parentNode = null;
    this.childNodes = [];
    if (v !== "" && v !== null && v !== undefined) this.append(new FakeText(String(v)));
  }
}

export class FakeText extends FakeNode {
  constructor(data) {
    super();
    this.data = data;
  }
  get textContent() {
    return this.data;
  }
  set textContent(v) {
    this.data = String(v);
  }
}

const unescape = (s) => s.replace(/<[^>]*>/g, "").replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&amp;/g, "&");

export class FakeElement extends FakeNode {
  constructor(tag) {
    super();
    this.tagName = tag.toUpperCase();
    this.attributes = new Map();
    this.listeners = new Map();
    this.className = "";
    this.value = "";
    this.html = null;
  }
  setAttribute(k, v) {
    this.attributes.set(k, String(v));
  }
  getAttribute(k) {
    return this.attributes.has(k) ? this.attributes.get(k) : null;
  }
  hasAttribute(k) {
    return this.attributes.has(k);
  }
  removeAttribute(k) {
    this.attributes.delete(k);
  }
  get hidden() {
    return this.attributes.has("hidden");
  }
  set hidden(v) {
    if (v) this.attributes.set("hidden", "");
    else this.attributes.delete("hidden");
  }
  // innerHTML is kept as given; its text is the markup without tags, unescaped.
  get innerHTML() {
    return this.html ?? "";
  }
  set innerHTML(v) {
    this.textContent = "";
    this.html = String(v);
  }
  get textContent() {
    return this.html !== null ? unescape(this.html) : super.textContent;
  }
  set textContent(v) {
    this.html = null;
    super.textContent = v;
  }
  addEventListener(type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
  }
  removeEventListener(type, fn) {
    this.listeners.get(type)?.delete(fn);
  }
  dispatch(type, ev = {}) {
    for (const fn of this.listeners.get(type) ?? []) fn(ev);
  }
  click() {
    this.dispatch("click", {});
  }
}

// Every element under `root` (itself included) that `pred` accepts, in document order.
export function findAll(root, pred) {
  const out = [];
  const walk = (n) => {
    if (n instanceof FakeElement && pred(n)) out.push(n);
    for (const c of n.childNodes) walk(c);
  };
  walk(root);
  return out;
}

export const byTestIdAll = (root, id) => findAll(root, (e) => e.getAttribute("data-testid") === id);

// The one element with `data-testid=id` (throws when there is none or more than one).
export function byTestId(root, id) {
  const found = byTestIdAll(root, id);
  if (found.length !== 1) throw new Error(`${found.length} elements with data-testid=${id}`);
  return found[0];
}

export const texts = (els) => els.map((e) => e.textContent);

class FakeStorage {
  constructor() {
    this.items = new Map();
  }
  getItem(k) {
    return this.items.has(k) ? this.items.get(k) : null;
  }
  setItem(k, v) {
    this.items.set(k, String(v));
  }
  removeItem(k) {
    this.items.delete(k);
  }
  clear() {
    this.items.clear();
  }
}

globalThis.Node = FakeNode;
globalThis.document = {
  createElement: (tag) => new FakeElement(tag),
  createTextNode: (data) => new FakeText(data),
};
globalThis.window = new FakeElement("window");
// Browser scripts (xterm.js's bundles) find the global object as `self`.
globalThis.self = globalThis;
globalThis.localStorage = new FakeStorage();

// Lets every pending promise chain (the fake engine answers in microtasks) run to its end.
export async function settle() {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}
