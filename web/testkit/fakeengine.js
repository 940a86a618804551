// A stand-in for the engine behind `host.iii`: answers each function from a table (a value, or
// a function of the payload that may return a rejection with the engine's `{code, message}`), records every call,
// and keeps the browser-side functions and trigger bindings the page registers.

export function fakeCall(routes = {}) {
  const calls = [];
  const call = (fid, payload) => {
    calls.push([fid, structuredClone(payload)]);
    return Promise.resolve().then(() => {
      const r = routes[fid];
      if (r === undefined) return Promise.reject({ code: "function_not_found", message: `no ${fid}` });
      return typeof r === "function" ? r(payload) : structuredClone(r);
    });
  };
  call.calls = calls;
  call.routes = routes;
  // The calls made to `fid`, their payloads in order.
  call.to = (fid) => calls.filter(([f]) => f === fid).map(([, p]) => p);
  return call;
}

// A promise with its resolve/reject at hand (to answer a call later).
export function deferred() {
  let resolve, reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

export function fakeHost(routes = {}, browserId = "b1") {
  const trigger = fakeCall(routes);
  const functions = new Map();
  const bindings = [];
  const log = [];
  const iii = {
    browserId,
    trigger,
    on(name, handler) {
      functions.set(name, handler);
      log.push(["on", name]);
      return () => {
        functions.delete(name);
        log.push(["off", name]);
      };
    },
    registerTrigger(spec) {
      const b = { ...spec, bound: true };
      bindings.push(b);
      return () => {
        b.bound = false;
      };
    },
  };
  return { iii, functions, bindings, log, calls: trigger };
}

// The engine's error answer, as a route's result.
export const fail = (code, message) => () => Promise.reject({ code, message });
