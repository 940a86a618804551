// The page's lint: ESLint's recommended rules (undefined names, unused variables, unreachable
// code, ...) and a few more that catch slips, over the page, its test host, the build and the
// unit tests, each with the globals of where it runs.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["dist/", "host/dist/", "node_modules/"] },
  js.configs.recommended,
  {
    languageOptions: { ecmaVersion: 2022, sourceType: "module" },
    linterOptions: { reportUnusedDisableDirectives: "error" },
    rules: {
      "no-unused-vars": ["error", { args: "all", argsIgnorePattern: "^_", caughtErrors: "all" }],
      "no-shadow": "error",
      "no-use-before-define": ["error", { functions: false, classes: false, variables: true }],
      "prefer-const": "error",
      "no-var": "error",
      eqeqeq: "error",
      "no-implicit-coercion": "error",
      "no-return-assign": "error",
      "no-throw-literal": "error",
      "no-unused-expressions": "error",
    },
  },
  { files: ["src/**/*.js", "host/host.js"], languageOptions: { globals: globals.browser } },
  { files: ["build.mjs", "test/**/*.js", "testkit/**/*.js", "eslint.config.js"], languageOptions: { globals: globals.node } },
  // The driver runs in node, and the functions it hands to page.evaluate run in the page.
  { files: ["host/drive.mjs"], languageOptions: { globals: { ...globals.node, ...globals.browser } } },
];
