// The test host's console: the `setup(host)` API of the iii console's injectable UI, as
// shared/docs/iii-console-extensions.md describes it, and nothing more:
//   * an engine client on the engine's WebSocket (trigger, on, registerTrigger, browserId);
//   * the page slot (host.pages.register → #/ext/<id>, mounted in a data-iii-ui scope wrapper);
//   * asset loading as the console does it: the manifest at /ui, styles as <link>, scripts as
//     ES modules imported from /ui/<path>?v=<hash>, whose default export is setup(host).
import { createElement, createRoot } from "react";

const params = new URLSearchParams(location.search);
const engineUrl = params.get("engine");
const browserId = "console-" + crypto.randomUUID();

// ---- engine client
const pending = new Map();
const handlers = new Map();
const stateListeners = new Set();
let ws;
let ready;

function send(frame) {
  ws.send(JSON.stringify(frame));
}

function connect() {
  ready = new Promise((resolve, reject) => {
    ws = new WebSocket(engineUrl);
    ws.onopen = () => {
      send({ type: "invokefunction", invocation_id: null, function_id: "engine::workers::register", action: { type: "void" }, data: { name: browserId, runtime: "browser", version: "test-host" } });
      for (const l of stateListeners) l("connected");
      resolve();
    };
    ws.onerror = (e) => reject(e);
    ws.onclose = () => {
      for (const l of stateListeners) l("disconnected");
      for (const [, p] of pending) p.reject({ code: "connection_lost", message: "the engine connection closed" });
      pending.clear();
    };
    ws.onmessage = async (msg) => {
      const f = JSON.parse(msg.data);
      if (f.type === "ping") return send({ type: "pong" });
      if (f.type === "invocationresult") {
        const p = pending.get(f.invocation_id);
        if (!p) return;
        pending.delete(f.invocation_id);
        if (f.error) p.reject(f.error);
        else p.resolve(f.result ?? null);
        return;
      }
      if (f.type === "invokefunction") {
        const h = handlers.get(f.function_id);
        let error = null;
        try {
          if (h) await h(f.data);
          else error = { code: "function_not_found", message: `no browser function ${f.function_id}` };
        } catch (e) {
          error = { code: "handler_error", message: String(e) };
        }
        if (f.invocation_id) {
          const out = { type: "invocationresult", invocation_id: f.invocation_id, function_id: f.function_id };
          if (error) out.error = error;
          else out.result = null;
          send(out);
        }
      }
    };
  });
  return ready;
}

const iii = {
  browserId,
  async trigger(functionId, payload = {}, { timeoutMs = 30000 } = {}) {
    await ready;
    const id = crypto.randomUUID();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        pending.delete(id);
        reject({ code: "timeout", message: `${functionId}: no answer within ${timeoutMs} ms` });
      }, timeoutMs);
      pending.set(id, {
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      });
      send({ type: "invokefunction", invocation_id: id, function_id: functionId, data: payload });
    });
  },
  on(functionId, handler) {
    const id = `${functionId}::${browserId}`;
    handlers.set(id, handler);
    ready.then(() => send({ type: "registerfunction", id, metadata: { internal: true } }));
    return () => {
      handlers.delete(id);
      send({ type: "unregisterfunction", id });
    };
  },
  registerTrigger({ type, function_id, config }) {
    const id = crypto.randomUUID();
    ready.then(() => send({ type: "registertrigger", id, trigger_type: type, function_id, config: config ?? {} }));
    return () => send({ type: "unregistertrigger", id, trigger_type: type });
  },
  addConnectionStateListener(fn) {
    stateListeners.add(fn);
    return () => stateListeners.delete(fn);
  },
};

// ---- slots
const pages = new Map();
const nav = document.getElementById("nav");
const slot = document.getElementById("page");
let root = null;
let mounted = null;

function route() {
  const m = /^#\/ext\/([a-z0-9-]+)/.exec(location.hash);
  const id = m ? m[1] : null;
  const page = id ? pages.get(id) : null;
  if (mounted === page) return;
  if (root) root.unmount();
  root = null;
  mounted = page;
  if (!page) return;
  root = createRoot(slot);
  root.render(createElement("div", { "data-iii-ui": page.scope, style: { display: "contents" } }, createElement(page.render, {})));
}
window.addEventListener("hashchange", route);

function hostFor(path) {
  const scope = path.split("/")[0];
  return {
    iii,
    path,
    useTheme: () => "light",
    components: {},
    pages: {
      register({ id, title, render }) {
        pages.set(id, { id, title, render, scope });
        const link = document.createElement("a");
        link.href = `#/ext/${id}`;
        link.textContent = title;
        nav.append(link);
        route();
        return () => {
          pages.delete(id);
          link.remove();
          route();
        };
      },
    },
    functionTriggers: { register: () => () => {} },
    configForms: { register: () => () => {} },
  };
}

// ---- assets, as the console loads them
async function loadAssets() {
  const manifest = await (await fetch("/ui")).json();
  for (const a of manifest.assets.filter((x) => x.kind === "style")) {
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = `/ui/${a.path}?v=${a.hash}`;
    document.head.append(link);
    await new Promise((r) => { link.onload = r; link.onerror = r; });
  }
  for (const a of manifest.assets.filter((x) => x.kind === "script")) {
    const mod = await import(`/ui/${a.path}?v=${a.hash}`);
    await mod.default(hostFor(a.path));
  }
}

window.__testHost = { iii, ready: connect().then(loadAssets).then(() => "ready") };
