// The page body: workspace picker, live file tree, file view, diff view, turn history and a
// terminal. `mountShellPage(el, host)` builds it inside `el` and returns its teardown.
// Each pane is its own module; this one only lays them out and wires them together.
import { h, clear, debounce } from "./dom.js";
import { relative } from "./paths.js";
import { createTransport, createFanout } from "./transport.js";
import { createPaneState } from "./state.js";
import { createBaselines } from "./baselines.js";
import { CHANGED_FN, changedConfig, routeChange } from "./changes.js";
import { createWorkspacePicker } from "./workspace.js";
import { createExplorer } from "./explorer.js";
import { createFileView } from "./fileview.js";
import { createDiffPane } from "./diffs.js";
import { createTurnsPane } from "./turns.js";
import { createTerminalPane } from "./terminal.js";

// The browser-side function the worker pushes terminal output to.
const PTY_OUTPUT_FN = "iii::shell-ui::pty-output";
// Everything shown is refreshed this often besides the change feed (sessions and turns).
const POLL_MS = 3000;

// `lib` is the terminal emulator (xterm.js unless a test passes a stand-in).
export function mountShellPage(el, host, lib = undefined) {
  const io = createTransport(host.iii);
  const { call } = io;
  const state = createPaneState(call);
  const root = () => state.get().root;
  const baselines = createBaselines();
  const cleanups = [];

  const picker = createWorkspacePicker({ call, onPick: (r) => setRoot(r) });
  const files = createFileView({ call, root, baselines, onOpen: (path) => state.update({ open: path }) });
  const tree = createExplorer({ call, root, openPath: files.openPath, onOpenFile: (path, opts) => files.show(path, opts) });
  const diffs = createDiffPane({ call, root, baselines });
  const turns = createTurnsPane({
    call,
    state,
    root,
    onReverted: (restored) => {
      if (files.openPath()) files.show(files.openPath());
      tree.refresh();
      // The revert wrote these files: the last restored one becomes the diff, whether or not
      // the change feed reports it.
      if (restored.length) diffs.written(restored[restored.length - 1], "modified");
    },
  });
  const termEl = h("section", { class: "shell-term" });

  el.append(
    h(
      "div",
      { class: "shell-root" },
      h("header", { class: "shell-top" }, ...picker.bar),
      picker.choices,
      h(
        "div",
        { class: "shell-body" },
        h("aside", { class: "shell-side" }, h("div", { class: "shell-pane-title", text: "Files" }), tree.el),
        h("div", { class: "shell-main" }, files.el, diffs.el),
        turns.el,
      ),
      termEl,
    ),
  );

  // ---- the workspace and its live change feed
  let unbindChanged = null;
  function setRoot(r) {
    state.update({ root: r });
    picker.show(r);
    tree.reset();
    if (unbindChanged) unbindChanged();
    unbindChanged = io.bind("shell::changed", io.fid(CHANGED_FN), changedConfig(r));
    tree.refresh();
  }
  cleanups.push(() => unbindChanged && unbindChanged());

  const refreshTreeSoon = debounce(() => tree.refresh(), 60);
  const refreshTurnsSoon = debounce(() => turns.refreshTurns(), 250);
  const refreshSessionsSoon = debounce(() => turns.refreshSessions(), 250);
  cleanups.push(
    io.on(CHANGED_FN, (ev) => {
      const route = routeChange(ev, root(), files.openPath());
      if (!route) return;
      refreshTreeSoon();
      refreshTurnsSoon();
      refreshSessionsSoon();
      if (route.file) files.show(route.file.path, route.file.missing ? { missing: true } : {});
      if (route.diff) diffs.written(route.diff.path, route.diff.kind);
    }),
  );

  // ---- terminal output, pushed by the worker to one browser-side function
  const ptyOutput = createFanout();
  cleanups.push(io.on(PTY_OUTPUT_FN, (ev) => ptyOutput.emit(ev)));
  let disposeTerminal = null;

  // ---- start: restore the pane's state, then the workspace
  (async () => {
    const saved = await state.restore();
    turns.showSession(saved.session_id);
    disposeTerminal = createTerminalPane(
      termEl,
      {
        call,
        outputFid: io.fid(PTY_OUTPUT_FN),
        cwd: () => root() || "/",
        saved: () => state.get().terminal,
        save: (t) => state.update({ terminal: t }),
        onOutput: ptyOutput.add,
      },
      lib,
    );
    if (saved.root) {
      picker.show(saved.root, { input: true });
      setRoot(saved.root);
      if (saved.open && relative(saved.root, saved.open) !== null) files.show(saved.open);
    } else {
      picker.showRoots();
    }
    turns.refreshSessions();
    if (saved.session_id) turns.refreshTurns();
  })();
  const poll = setInterval(() => {
    turns.refreshSessions();
    turns.refreshTurns();
  }, POLL_MS);
  cleanups.push(() => clearInterval(poll));

  return () => {
    state.cancel();
    for (const c of cleanups) {
      try {
        c();
      } catch {
        /* keep tearing down */
      }
    }
    if (disposeTerminal) disposeTerminal();
    clear(el);
  };
}
