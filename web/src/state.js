// The page's state (shell::ui-state): workspace, open file, turn session and terminal, kept
// under one pane key and written back (debounced) on every change.
import { debounce } from "./dom.js";

// The pane's state key in shell::ui-state.
export const STATE_KEY = "shell:explorer";

export const INITIAL_STATE = Object.freeze({ root: null, open: null, session_id: "", terminal: null });

// The state after a `shell::ui-state::get` answer: a stored object overrides the fields it
// has; anything else (null, a string, an array's absence of fields) keeps `state`.
export function restoredState(state, got) {
  if (got && got.state && typeof got.state === "object") return { ...state, ...got.state };
  return state;
}

// `call(fid, payload)` reaches the engine. Returns the store: `get()` is the current state,
// `update(patch)` merges and saves soon, `restore()` reads the stored state once.
export function createPaneState(call, { saveDelay = 200 } = {}) {
  let state = { ...INITIAL_STATE };
  const save = debounce(() => {
    call("shell::ui-state::set", { key: STATE_KEY, state }).catch((e) => console.warn("ui-state::set", e));
  }, saveDelay);
  return {
    get: () => state,
    update(patch) {
      state = { ...state, ...patch };
      save();
    },
    async restore() {
      try {
        state = restoredState(state, await call("shell::ui-state::get", { key: STATE_KEY }));
      } catch (e) {
        console.warn("ui-state::get", e);
      }
      return state;
    },
    cancel: () => save.cancel(),
  };
}
