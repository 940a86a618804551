// The browser test's driver: headless Chromium (Debian's) through playwright-core, against the
// test host page, the test engine and `iii-shell serve`. Run by cli/tests/suite/console_page.rs:
//   node host/drive.mjs <host url> <workspace dir> <screenshot dir>
// Prints one line per step and `DRIVE OK` at the end; any failure exits 1 with a screenshot.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, ws, shots] = process.argv.slice(2);
const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
const profile = mkdtempSync(join(tmpdir(), "iii-shell-ui-profile-"));
const args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"];
const ctx = await chromium.launchPersistentContext(profile, { executablePath: chromiumPath, headless: true, args, viewport: { width: 1400, height: 900 } });
const page = ctx.pages()[0] || (await ctx.newPage());
const logs = [];
page.on("console", (m) => logs.push(`[console.${m.type()}] ${m.text()}`));
page.on("pageerror", (e) => logs.push(`[pageerror] ${e.message}`));
// Nothing may be fetched from anywhere but the host page's own origin and the engine.
const origin = new URL(url).origin;
const foreign = [];
page.on("request", (r) => {
  const u = r.url();
  if (!u.startsWith(origin) && !u.startsWith("blob:") && !u.startsWith("data:")) foreign.push(u);
});

const step = (s) => console.log(`step: ${s}`);
const call = (fid, payload) => page.evaluate(([f, p]) => window.__testHost.iii.trigger(f, p), [fid, payload]);
// The text of the first match now ("" when there is none): never waits.
const text = (sel) => page.evaluate((s) => document.querySelector(s)?.innerText ?? "", sel);
const termText = () => page.evaluate(() => [...document.querySelectorAll("[data-testid=terminal] .xterm-rows > div")].map((d) => d.textContent.replace(/\u00a0/g, " ").trimEnd()));
async function until(what, fn, timeout = 10000) {
  const end = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 25));
  }
}
async function load(again = false) {
  // A second goto to the same URL with a #fragment would not reload the document.
  if (again) await page.reload();
  else await page.goto(url);
  await until("the host to load the page's assets", () => page.evaluate(() => window.__testHost && window.__testHost.ready));
  await page.locator("[data-testid=ws-input]").waitFor();
}

try {
  step("open the page");
  await load();
  await until("workspace roots", async () => (await page.locator("[data-testid=ws-root]").count()) > 0);

  step("pick the workspace");
  await page.fill("[data-testid=ws-input]", ws);
  await page.click("[data-testid=ws-open]");
  await until("the workspace to open", async () => (await text("[data-testid=ws-current]")) === ws);
  await page.locator(`[data-path="${ws}/README.md"]`).waitFor({ timeout: 10000 });
  await page.screenshot({ path: join(shots, "01-workspace.png") });

  step("a file created by shell::exec appears in the tree within a second");
  await new Promise((r) => setTimeout(r, 300)); // let the change-feed binding settle
  const t0 = Date.now();
  const exec = await call("shell::exec", { command: "sh", args: ["-c", "printf 'fn main() {\\n    println!(\"hello\");\\n}\\n' > hello.rs"], cwd: ws });
  if (exec.exit_code !== 0) throw new Error(`shell::exec: ${JSON.stringify(exec)}`);
  // From the moment the file exists (shell::exec answered) until the tree shows it.
  const t1 = Date.now();
  await page.locator(`[data-path="${ws}/hello.rs"]`).waitFor({ timeout: 5000 });
  const appeared = Date.now() - t1;
  console.log(`tree: hello.rs appeared ${appeared} ms after shell::exec answered (${Date.now() - t0} ms after it was called)`);
  if (appeared > 1000) throw new Error(`hello.rs took ${appeared} ms to appear (limit 1000)`);

  step("open the file");
  await page.click(`[data-path="${ws}/hello.rs"]`);
  await until("the file view", async () => (await text("[data-testid=file-content]")).includes('println!("hello")'));
  if ((await page.locator("[data-testid=file-view] .hljs-keyword").count()) === 0) throw new Error("no syntax highlighting in the file view");

  step("write it with coder::update-file (inside a harness turn) and see the diff");
  const turn = { session_id: "ui-s1", turn_id: "t1" };
  await call("shell::turns::on-turn-started", { ...turn, message_preview: "greet the world" });
  const args2 = { files: [{ path: `${ws}/hello.rs`, ops: [{ op: "replace", pattern: "hello", replacement: "world" }] }] };
  const hook = { point: "pre_trigger", ...turn, step: 1, call: { id: "fc1", function_id: "coder::update-file", arguments: args2 } };
  await call("shell::turns::on-pre-trigger", hook);
  const upd = await call("coder::update-file", args2);
  if (!upd.results[0].success) throw new Error(`coder::update-file: ${JSON.stringify(upd)}`);
  await call("shell::turns::on-post-trigger", { ...hook, result: { is_error: false, content: [] } });
  await call("shell::turns::on-turn-completed", turn);
  await until("the diff view", async () => {
    const rows = await page.evaluate(() => ({
      path: document.querySelector("[data-testid=diff-path]")?.textContent,
      add: [...document.querySelectorAll("[data-testid=diff-view] .shell-diff-add")].map((e) => e.textContent),
      del: [...document.querySelectorAll("[data-testid=diff-view] .shell-diff-del")].map((e) => e.textContent),
    }));
    return rows.path === "hello.rs" && rows.add.some((t) => t.includes('println!("world")')) && rows.del.some((t) => t.includes('println!("hello")'));
  });
  await until("the file view to follow the disk", async () => (await text("[data-testid=file-content]")).includes('println!("world")'));
  console.log(`diff: ${await text("[data-testid=diff-view]")}`.replace(/\n/g, " | "));
  await page.screenshot({ path: join(shots, "02-diff.png") });

  step("the turns pane lists the sessions with recorded turns, newest first; one click opens one");
  // A second, newer session (an id that is not a file name: its log's name is a hash).
  const side = { session_id: "chat 9/side", turn_id: "s1" };
  await call("shell::turns::on-turn-started", { ...side, message_preview: "look around" });
  await call("shell::turns::on-turn-completed", side);
  const sessionItems = () => page.evaluate(() => [...document.querySelectorAll("[data-testid=turns-session-item]")].map((e) => ({
    id: e.dataset.sessionId,
    count: e.querySelector("[data-testid=session-turn-count]")?.textContent,
    title: e.querySelector("[data-testid=session-title]")?.textContent,
    times: e.querySelector("[data-testid=session-times]")?.textContent,
    selected: e.classList.contains("shell-selected"),
  })));
  const listed = (want) => async () => {
    const got = await sessionItems();
    if (JSON.stringify(got.map((x) => [x.id, x.count])) === JSON.stringify(want)) return got;
    throw new Error(JSON.stringify(got));
  };
  const shown = await until("both sessions listed, newest first", listed([["chat 9/side", "1 turn"], ["ui-s1", "1 turn"]]));
  if (shown[1].title !== "greet the world" || !/^\d\d:\d\d:\d\d · first \d\d:\d\d:\d\d$/.test(shown[1].times)) throw new Error(`session row: ${JSON.stringify(shown[1])}`);
  // The times shown are the worker's, in the browser's time zone.
  const wire = await call("shell::turns::sessions", {});
  const hhmmss = (ms) => new Date(ms).toTimeString().slice(0, 8);
  const ui = wire.sessions.find((x) => x.session_id === "ui-s1");
  if (shown[1].times !== `${hhmmss(ui.updated_at)} · first ${hhmmss(ui.first_started_at)}`) throw new Error(`times ${shown[1].times} vs ${JSON.stringify(ui)}`);
  console.log(`sessions: ${shown.map((x) => `${x.id} (${x.count}, ${x.times})`).join("; ")}`);
  if ((await page.locator("[data-testid=turn]").count()) !== 0) throw new Error("turns shown before a session was opened");
  await page.click('[data-testid=turns-session-item][data-session-id="ui-s1"]');
  await page.locator("[data-testid=turn][data-turn-id=t1]").waitFor({ timeout: 10000 });
  if (!(await text("[data-testid=turn][data-turn-id=t1]")).includes("greet the world")) throw new Error("the opened session's turn has no title");
  if ((await text("[data-testid=turns-current]")) !== "Turns of ui-s1") throw new Error(`heading: ${await text("[data-testid=turns-current]")}`);
  await until("the opened session marked", async () => (await sessionItems()).find((x) => x.id === "ui-s1")?.selected);
  if ((await page.inputValue("[data-testid=turns-session]")) !== "ui-s1") throw new Error("the id field does not follow the opened session");
  await page.screenshot({ path: join(shots, "03-sessions.png") });

  step("revert the turn and see the file restored");
  await page.click("[data-testid=turn][data-turn-id=t1] [data-testid=revert-turn]");
  await until("the revert result", async () => (await text("[data-testid=revert-result]")).startsWith("reverted 1, failed 0"));
  await until("the restored file in the view", async () => (await text("[data-testid=file-content]")).includes('println!("hello")'));
  const disk = await call("coder::read-file", { path: `${ws}/hello.rs` });
  if (!disk.content.includes('println!("hello")')) throw new Error(`not restored on disk: ${disk.content}`);
  await page.screenshot({ path: join(shots, "03-reverted.png") });

  step("revert one file of a turn");
  const t2 = { session_id: "ui-s1", turn_id: "t2" };
  await call("shell::turns::on-turn-started", { ...t2, message_preview: "rename demo" });
  const args3 = { files: [
    { path: `${ws}/src/lib.rs`, ops: [{ op: "replace", pattern: "demo", replacement: "demo2" }] },
    { path: `${ws}/README.md`, ops: [{ op: "replace", pattern: "demo", replacement: "demo2" }] },
  ] };
  const hook3 = { point: "pre_trigger", ...t2, step: 1, call: { id: "fc2", function_id: "coder::update-file", arguments: args3 } };
  await call("shell::turns::on-pre-trigger", hook3);
  await call("coder::update-file", args3);
  await call("shell::turns::on-post-trigger", { ...hook3, result: { is_error: false, content: [] } });
  await call("shell::turns::on-turn-completed", t2);
  // The last file written shows as the diff before anything else happens.
  await until("the diff of the turn's last write", async () => (await text("[data-testid=diff-path]")) === "README.md");
  // The session that just had a turn moves to the top of the list, with its new count.
  await until("ui-s1 on top with 2 turns", listed([["ui-s1", "2 turns"], ["chat 9/side", "1 turn"]]));
  // The typed id is the fallback: it loads the session as a click does.
  await page.fill("[data-testid=turns-session]", "ui-s1");
  await page.click("[data-testid=turns-load]");
  const oneFile = '[data-testid=turn][data-turn-id=t2] li:has(code:text-is("src/lib.rs")) [data-testid=revert-file]';
  await page.locator(oneFile).waitFor({ timeout: 10000 });
  await page.click(oneFile);
  await until("the one-file revert", async () => (await text("[data-testid=revert-result]")).startsWith("reverted 1, failed 0"));
  const lib = await call("coder::read-file", { path: `${ws}/src/lib.rs` });
  const readme = await call("coder::read-file", { path: `${ws}/README.md` });
  if (!lib.content.includes("fn demo()") || !readme.content.includes("demo2")) throw new Error(`one-file revert: lib.rs=${lib.content} README.md=${readme.content}`);
  await until("the reverted file's diff", async () => {
    const d = await text("[data-testid=diff-view]");
    if (d.includes("src/lib.rs") && d.includes("demo2()") && /\+\s*pub fn demo\(\)/.test(d)) return true;
    throw new Error(d.replace(/\n/g, " | "));
  }, 5000);

  step("type `echo hi` in a terminal and see hi");
  await page.click("[data-testid=term-new]");
  await until("the terminal session", async () => (await text("[data-testid=term-status]")).startsWith("session "));
  await page.click("[data-testid=terminal]");
  await page.keyboard.type("echo hi\n");
  await until("`hi` on its own line", async () => (await termText()).some((l) => l === "hi"));
  await page.click("[data-testid=font-up]");
  if ((await text("[data-testid=font-size]")) !== "15px") throw new Error("font stepper did not step");
  await page.screenshot({ path: join(shots, "04-terminal.png") });

  step("reload and see the scrollback replayed");
  await load(true);
  await until("the terminal to reattach", async () => (await text("[data-testid=term-status]")).startsWith("reattached "));
  await until("the replayed scrollback", async () => {
    const lines = await termText();
    return lines.some((l) => l.includes("echo hi")) && lines.some((l) => l === "hi");
  });
  if ((await text("[data-testid=font-size]")) !== "15px") throw new Error("the font size is not kept per browser");
  await until("the open file restored", async () => (await text("[data-testid=file-content]")).includes('println!("hello")'));
  if ((await text("[data-testid=ws-current]")) !== ws) throw new Error("the workspace was not restored from ui-state");
  await until("the open session restored and marked in the list", async () => (await sessionItems()).find((x) => x.id === "ui-s1")?.selected && (await page.locator("[data-testid=turn][data-turn-id=t2]").count()) === 1);
  await page.screenshot({ path: join(shots, "05-reloaded.png") });

  step("leave the page (its terminal detaches), forget the session, come back and adopt it");
  const sid = (await text("[data-testid=term-status]")).split(" ")[1];
  await page.evaluate(() => (location.hash = "#/"));
  await page.locator("[data-testid=terminal]").waitFor({ state: "detached" });
  const saved = await call("shell::ui-state::get", { key: "shell:explorer" });
  await until("the session to be detached", async () => {
    const { sessions } = await call("shell::pty::sessions", {});
    return sessions.some((s) => s.session_id.startsWith(sid) && s.status === "detached" && s.ui === "shell");
  });
  await call("shell::ui-state::set", { key: "shell:explorer", state: { ...saved.state, terminal: null } });
  await page.evaluate(() => (location.hash = "#/ext/shell"));
  await page.locator("[data-testid=adopt]").first().waitFor({ timeout: 10000 });
  await page.click("[data-testid=adopt]");
  await until("the adopted session", async () => (await text("[data-testid=term-status]")).startsWith(`adopted ${sid}`));
  await until("the adopted scrollback", async () => (await termText()).some((l) => l === "hi"));
  await page.click("[data-testid=terminal]");
  await page.keyboard.type("echo adopted-$((6*7))\n");
  await until("output of the adopted session", async () => (await termText()).some((l) => l === "adopted-42"));
  await page.screenshot({ path: join(shots, "06-adopted.png") });

  step("an image and a large file are read in chunks (shell::workspace::read-bytes)");
  const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
  await call("shell::exec", { command: "sh", args: ["-c", `echo ${png} | base64 -d > dot.png && head -c 2500000 /dev/zero | tr '\\0' a > big.txt`], cwd: ws });
  await page.locator(`[data-path="${ws}/dot.png"]`).waitFor({ timeout: 5000 });
  await page.click(`[data-path="${ws}/dot.png"]`);
  await until("the image", () => page.evaluate(() => { const i = document.querySelector("[data-testid=file-image]"); return i && i.complete && i.naturalWidth === 1; }));
  await page.locator(`[data-path="${ws}/big.txt"]`).waitFor({ timeout: 5000 });
  await page.click(`[data-path="${ws}/big.txt"]`);
  await until("the large file, in 3 chunks", async () => (await text("[data-testid=file-view]")).includes("showing 2500000 of 2500000 bytes (read in 3 chunks)"));

  if (foreign.length) throw new Error(`the page fetched from elsewhere: ${foreign.join(", ")}`);
  console.log("DRIVE OK");
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
  process.exit(0);
} catch (e) {
  console.log(`DRIVE FAILED: ${e && e.stack ? e.stack : e}`);
  for (const l of logs.slice(-40)) console.log(l);
  try {
    await page.screenshot({ path: join(shots, "failure.png") });
  } catch {
    /* the browser may be gone */
  }
  await ctx.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
  process.exit(1);
}
