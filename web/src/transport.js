// How the page reaches the engine: everything goes through `host.iii` (engine calls,
// browser-side functions, trigger bindings); nothing else touches the network.

// A browser-side function's id for this browser: `<name>::<browserId>`, as `host.iii.on`
// registers it.
export function browserFid(name, browserId) {
  return `${name}::${browserId}`;
}

export function createTransport(iii) {
  return {
    // An engine call: resolves with the result, rejects with the engine's `{code, message}`.
    call: (fid, payload) => iii.trigger(fid, payload),
    // A browser-side function `name` (registered per browser); returns its unregistration.
    on: (name, handler) => iii.on(name, handler),
    // The id the worker calls for the browser-side function `name`.
    fid: (name) => browserFid(name, iii.browserId),
    // A trigger binding of `type` to a browser-side function; returns its unbinding.
    bind: (type, functionId, config) => iii.registerTrigger({ type, function_id: functionId, config }),
  };
}

// One browser-side function's events handed to any number of listeners.
export function createFanout() {
  const listeners = new Set();
  return {
    emit(ev) {
      for (const l of listeners) l(ev);
    },
    add(cb) {
      listeners.add(cb);
      return () => listeners.delete(cb);
    },
    get size() {
      return listeners.size;
    },
  };
}
