// The diff view: a line diff (jsdiff) of two bodies, as rows of added / removed / kept lines.
import { diffLines } from "diff";
import { h, clear } from "./dom.js";

// Rows of a line diff: [{kind: "add"|"del"|"same", text}] (pure: no DOM).
export function diffRows(oldText, newText) {
  const rows = [];
  for (const part of diffLines(oldText ?? "", newText ?? "")) {
    const kind = part.added ? "add" : part.removed ? "del" : "same";
    const lines = part.value.split("\n");
    if (lines[lines.length - 1] === "") lines.pop();
    for (const text of lines) rows.push({ kind, text });
  }
  return rows;
}

export function renderDiff(el, { path, oldText, newText, source, isBinary }) {
  clear(el);
  el.append(h("div", { class: "shell-pane-title" }, h("span", { text: "Diff " }), h("code", { "data-testid": "diff-path", text: path }), h("span", { class: "shell-muted", text: ` (${source})` })));
  if (isBinary) {
    el.append(h("div", { class: "shell-muted", text: "binary file: no text diff" }));
    return;
  }
  const rows = diffRows(oldText, newText);
  const table = h("div", { class: "shell-diff-rows", "data-testid": "diff-rows" });
  let added = 0, removed = 0;
  for (const r of rows) {
    if (r.kind === "add") added++;
    if (r.kind === "del") removed++;
    const sign = r.kind === "add" ? "+" : r.kind === "del" ? "-" : " ";
    table.append(h("div", { class: `shell-diff-${r.kind}` }, h("span", { class: "shell-diff-sign", text: sign }), h("span", { text: r.text })));
  }
  el.append(h("div", { class: "shell-muted", "data-testid": "diff-stats", text: `+${added} −${removed}` }), table);
}
