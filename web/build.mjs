// Builds the console page into dist/ (committed; the iii-shell binary embeds it):
//   dist/page.js   the console:script asset `shell/page.js` (ES module, React external)
//   dist/page.css  the console:style asset `shell/page.css` (every rule under [data-iii-ui="shell"])
// and the test host's React bundle into host/dist/ (not committed; only the browser test uses it).
// The output is deterministic: same lockfile, same bytes (no timestamps, no absolute paths).
import * as esbuild from "esbuild";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";

const here = new URL(".", import.meta.url).pathname;
const external = ["react", "react-dom", "react-dom/client", "react/jsx-runtime", "@iii-dev/console-ui"];

// The bundled libraries' licenses travel with the bundle (their dist files carry no legal
// comments of their own): name, version, license id and the full license text.
const bundled = ["@xterm/xterm", "@xterm/addon-fit", "highlight.js", "diff"];
const notices = bundled
  .map((name) => {
    const pkg = JSON.parse(readFileSync(`${here}node_modules/${name}/package.json`, "utf8"));
    const text = readFileSync(`${here}node_modules/${name}/LICENSE`, "utf8").trim().replace(/\*\//g, "* /");
    return `${name} ${pkg.version} (${pkg.license})\n\n${text}`;
  })
  .join("\n\n----\n\n");
const banner = `/*! iii-shell console page (Apache-2.0). It bundles these libraries, under their own licenses:\n\n${notices}\n*/`;

mkdirSync(here + "dist", { recursive: true });
await esbuild.build({
  banner: { js: banner },
  absWorkingDir: here,
  entryPoints: ["src/index.js"],
  outfile: "dist/page.js",
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2020",
  minify: true,
  charset: "utf8",
  legalComments: "eof",
  external,
  logLevel: "warning",
});

// Scope a plain stylesheet (no @-blocks) under the console's wrapper.
function scope(css, origin) {
  const out = [];
  const body = css.replace(/\/\*[\s\S]*?\*\//g, "");
  if (body.includes("@")) throw new Error(`${origin}: @-rules are not supported by the scoper`);
  for (const rule of body.split("}")) {
    const i = rule.indexOf("{");
    if (i < 0) {
      if (rule.trim()) throw new Error(`${origin}: cannot parse ${rule.trim().slice(0, 40)}`);
      continue;
    }
    const selectors = rule.slice(0, i).split(",").map((s) => s.trim()).filter(Boolean);
    const decls = rule.slice(i + 1).trim().replace(/\s+/g, " ");
    out.push(`${selectors.map((s) => `[data-iii-ui="shell"] ${s}`).join(", ")} { ${decls} }`);
  }
  return out.join("\n") + "\n";
}

const xtermCss = readFileSync(here + "node_modules/@xterm/xterm/css/xterm.css", "utf8");
const own = readFileSync(here + "src/page.css", "utf8");
writeFileSync(
  here + "dist/page.css",
  own + "\n/* xterm.js (MIT, Copyright (c) The xterm.js authors), scoped */\n" + scope(xtermCss, "xterm.css"),
);

// The test host's React (one module serving both `react` and `react-dom/client`).
mkdirSync(here + "host/dist", { recursive: true });
await esbuild.build({
  absWorkingDir: here,
  stdin: {
    contents: 'import * as React from "react"; import { createRoot } from "react-dom/client"; export const { createElement, useRef, useEffect, useState, useLayoutEffect, Fragment, StrictMode } = React; export { createRoot }; export default React;',
    resolveDir: here,
    sourcefile: "vendor-react.js",
  },
  outfile: "host/dist/react.js",
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2020",
  minify: true,
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "warning",
});
