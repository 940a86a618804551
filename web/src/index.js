// The iii-shell console page: registered with the console at #/ext/shell.
//
// The console loads this module (the `console:script` asset `shell/page.js`, served by
// `shell::ui-content`) and calls its default export with `host`. Everything the page does
// goes through `host.iii` (engine calls, browser-side functions, trigger bindings), and every
// registration is undone by the returned teardown.
import * as React from "react";
import { mountShellPage } from "./app.js";

export default function setup(host) {
  function ShellPage() {
    const ref = React.useRef(null);
    React.useEffect(() => mountShellPage(ref.current, host), []);
    return React.createElement("div", { ref, className: "shell-page" });
  }
  const unregister = host.pages.register({ id: "shell", title: "Shell", render: ShellPage });
  return () => {
    if (typeof unregister === "function") unregister();
  };
}
