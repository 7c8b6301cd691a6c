// `longctx serve` as a process: the vLLM-shaped command line (`serve MODEL` positional, --host
// with a host name), the model given twice refused, and the accept-failure log rate-limited when
// the process runs out of file descriptors (a low RLIMIT_NOFILE through the shell's ulimit).
// Environment: LONGCTX_BIN (the longctx binary), LONGCTX_MODEL_DIR (models/needle).
import { spawn } from "node:child_process";
import { once } from "node:events";
import net from "node:net";
import { test } from "node:test";
import assert from "node:assert/strict";

import { env } from "./serve_helper.mjs";

const common = ["--device", "cpu", "--port", "0", "--max-model-len", "1024"];

// Starts `command` (argv) and resolves with its port once the listening line names `host`.
async function start(argv, host) {
  const proc = spawn(argv[0], argv.slice(1), { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no 'listening' line in 60 s: " + stderr)), 60000);
    const re = new RegExp(`listening on http://${host.replace(/\./g, "\\.")}:(\\d+)`);
    proc.stderr.on("data", () => {
      const m = re.exec(stderr);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on("exit", (code) => { clearTimeout(timer); reject(new Error(`serve exited with ${code}: ${stderr}`)); });
  });
  return {
    proc, port, stderr: () => stderr,
    async stop() {
      const exited = once(proc, "exit");
      proc.kill("SIGTERM");
      const [code] = await exited;
      return code;
    },
  };
}

test("serve MODEL (positional) with --host localhost", async () => {
  const s = await start([env("LONGCTX_BIN"), "serve", env("LONGCTX_MODEL_DIR"), ...common,
                         "--host", "localhost", "--served-model-name", "needle"], "localhost");
  const r = await fetch(`http://127.0.0.1:${s.port}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "needle", prompt: "The special magic number is", max_tokens: 2 }) });
  assert.equal(r.status, 200);
  const models = await (await fetch(`http://127.0.0.1:${s.port}/v1/models`)).json();
  assert.equal(models.data[0].id, "needle");
  assert.equal(await s.stop(), 0);
});

test("the model given twice, differently, is refused; an unknown host name too", async () => {
  const run = async (args) => {
    const proc = spawn(env("LONGCTX_BIN"), ["serve", ...args], { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    proc.stderr.on("data", (d) => { stderr += d; });
    const [code] = await once(proc, "exit");
    return { code, stderr };
  };
  let r = await run([env("LONGCTX_MODEL_DIR"), "--model", "/elsewhere", ...common]);
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /given twice/);
  r = await run([env("LONGCTX_MODEL_DIR"), ...common, "--host", "no-such-host.invalid"]);
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /no-such-host\.invalid/);
});

test("out of file descriptors: accept failures logged at most once a second, then recovery", async () => {
  const s = await start(["bash", "-c", 'ulimit -n 64 && exec "$@"', "bash", env("LONGCTX_BIN"),
                         "serve", env("LONGCTX_MODEL_DIR"), ...common], "127.0.0.1");
  // More connections than descriptors: the server accepts until it has none left, then every
  // accept fails while the rest wait in the backlog.
  const sockets = [];
  for (let i = 0; i < 120; ++i) {
    const sock = net.connect(s.port, "127.0.0.1");
    sock.on("error", () => {});
    sockets.push(sock);
  }
  await new Promise((r) => setTimeout(r, 3000));
  const lines = s.stderr().split("\n").filter((l) => l.includes("accept failed"));
  assert.ok(lines.length >= 1, "descriptors ran out: " + s.stderr());
  assert.ok(lines.length <= 5, `${lines.length} accept-failure lines in 3 s:\n${lines.join("\n")}`);
  assert.ok(lines.some((l) => /more failures not logged/.test(l)) || lines.length === 1,
            lines.join("\n"));
  for (const sock of sockets) sock.destroy();
  // Descriptors come back: the server answers again (its accept retries back off to 1 s).
  let status = 0;
  for (let i = 0; i < 50 && status !== 200; ++i) {
    await new Promise((r) => setTimeout(r, 200));
    try { status = (await fetch(`http://127.0.0.1:${s.port}/health`)).status; } catch { status = 0; }
  }
  assert.equal(status, 200);
  assert.equal(await s.stop(), 0);
});
