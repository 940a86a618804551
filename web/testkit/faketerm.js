// A stand-in for xterm.js (`Terminal`, `FitAddon`): records what the page writes, and lets a
// test type (onData) or resize (onResize) as the user would.
export class FakeTerminal {
  static last = null;
  constructor(options) {
    this.options = { ...options };
    this.cols = 80;
    this.rows = 24;
    this.written = "";
    this.resets = 0;
    this.focused = 0;
    this.disposed = false;
    this.addons = [];
    this.dataHandlers = [];
    this.resizeHandlers = [];
    FakeTerminal.last = this;
  }
  loadAddon(a) {
    this.addons.push(a);
  }
  open(el) {
    this.el = el;
  }
  write(bytes) {
    this.written += new TextDecoder().decode(bytes);
  }
  reset() {
    this.resets++;
    this.written = "";
  }
  focus() {
    this.focused++;
  }
  onData(cb) {
    this.dataHandlers.push(cb);
  }
  onResize(cb) {
    this.resizeHandlers.push(cb);
  }
  dispose() {
    this.disposed = true;
  }
  // What the user does.
  type(text) {
    for (const cb of this.dataHandlers) cb(text);
  }
  resize(cols, rows) {
    this.cols = cols;
    this.rows = rows;
    for (const cb of this.resizeHandlers) cb({ cols, rows });
  }
}

export class FakeFitAddon {
  constructor() {
    this.fits = 0;
  }
  fit() {
    this.fits++;
  }
}

export const fakeXterm = { Terminal: FakeTerminal, FitAddon: FakeFitAddon };
