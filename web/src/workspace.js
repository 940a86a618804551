// The workspace picker (shell::workspace::roots/list/validate): an input with Browse and
// Open, the current workspace, and a row of choices (the roots, or a folder's children).
import { h, clear, errorText } from "./dom.js";

// ctx: {call(fid, payload), onPick(root)}. `bar` goes in the page's top row, `choices` below it.
export function createWorkspacePicker(ctx) {
  const input = h("input", { class: "shell-ws-input", "data-testid": "ws-input", placeholder: "/path/to/workspace", spellcheck: "false" });
  const choices = h("div", { class: "shell-ws-choices", "data-testid": "ws-choices" });
  const current = h("code", { "data-testid": "ws-current", text: "no workspace" });
  const error = h("span", { class: "shell-error", "data-testid": "ws-error" });
  const bar = [
    h("strong", { text: "Workspace" }),
    input,
    h("button", { "data-testid": "ws-browse", onclick: () => browse(input.value) }, "Browse"),
    h("button", { "data-testid": "ws-open", onclick: () => pick(input.value) }, "Open"),
    current,
    error,
  ];

  async function showRoots() {
    try {
      const { roots } = await ctx.call("shell::workspace::roots", {});
      clear(choices);
      for (const r of roots) choices.append(h("button", { class: "shell-chip", "data-testid": "ws-root", onclick: () => browse(r) }, r));
    } catch (e) {
      error.textContent = `roots: ${errorText(e)}`;
    }
  }

  async function browse(path) {
    error.textContent = "";
    if (!path) return showRoots();
    try {
      const { path: dir, entries } = await ctx.call("shell::workspace::list", { path });
      input.value = dir;
      clear(choices);
      choices.append(h("button", { class: "shell-chip", "data-testid": "ws-pick", onclick: () => pick(dir) }, `Open ${dir}`));
      for (const e of entries) choices.append(h("button", { class: "shell-chip", "data-testid": "ws-child", onclick: () => browse(e.path) }, `${e.name}/`));
    } catch (e) {
      error.textContent = errorText(e);
    }
  }

  async function pick(path) {
    error.textContent = "";
    try {
      const { path: root } = await ctx.call("shell::workspace::validate", { path });
      input.value = root;
      clear(choices);
      ctx.onPick(root);
    } catch (e) {
      error.textContent = errorText(e);
    }
  }

  // Show `root` as the open workspace (in the input and as the current one).
  function show(root, { input: intoInput = false } = {}) {
    if (intoInput) input.value = root;
    current.textContent = root;
  }

  return { bar, choices, showRoots, browse, pick, show };
}
