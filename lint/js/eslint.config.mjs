// tandem view's page script (src/tandem/view/page/app.js): ESLint's recommended rules, for a browser script
// that plotly.js (a global) draws with. Run by `make lint-js`, which `make test` runs first.
import js from "@eslint/js";
import globals from "globals";

export default [
  js.configs.recommended,
  {
    files: ["**/*.js"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "script",
      globals: { ...globals.browser, Plotly: "readonly" },
    },
    rules: {
      "no-unused-vars": ["error", { args: "none" }],
      eqeqeq: ["error", "always"],
      "no-var": "error",
      "prefer-const": "error",
    },
  },
];
