import { test } from "node:test";
import assert from "node:assert/strict";
import { highlight, escapeHtml } from "../src/highlight.js";

test("escapeHtml: the five characters markup gives meaning to", () => {
  assert.equal(escapeHtml(`<a href="x">'&'</a>`), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  assert.equal(escapeHtml("plain"), "plain");
});

test("highlight: a known language is marked up, and its text stays escaped", () => {
  assert.equal(highlight("fn main() {}", "rust"), '<span class="hljs-keyword">fn</span> <span class="hljs-title function_">main</span>() {}');
  assert.equal(highlight('let s = "<b>";', "rust"), '<span class="hljs-keyword">let</span> <span class="hljs-variable">s</span> = <span class="hljs-string">&quot;&lt;b&gt;&quot;</span>;');
});

test("highlight: an unknown or missing language, or a very large text, is only escaped", () => {
  assert.equal(highlight("<x> fn", null), "&lt;x&gt; fn");
  assert.equal(highlight("<x> fn", "cobol"), "&lt;x&gt; fn");
  const big = "fn <".repeat(128 * 1024 + 1);
  assert.equal(highlight(big, "rust"), escapeHtml(big));
});
