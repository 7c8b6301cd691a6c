// Shared by the node tests of tests/server: `longctx serve` on the CPU with models/needle on a
// free port, read from its "listening" line.
// Environment: LONGCTX_BIN (the longctx binary), LONGCTX_MODEL_DIR (models/needle).
import { spawn } from "node:child_process";
import { once } from "node:events";
import assert from "node:assert/strict";

// A needle task models/needle answers (" 4821."): a question outside its training format can get
// an empty reply (EOS first), which tests of streamed text and stop strings cannot use.
export const needleQuestion =
  "A special magic number is hidden within the following text. One of the special magic numbers " +
  "for blue-fox is: 4821. What is the special magic number for blue-fox mentioned in the provided " +
  "text? The special magic number for blue-fox mentioned in the provided text is";

export const env = (name) => {
  const v = process.env[name];
  assert.ok(v, `${name} must be set (see the header of the test file)`);
  return v;
};

// Resolves once the server listens; stop() sends SIGTERM and returns its exit code and signal.
export async function startServer(args, extraEnv = {}) {
  const proc = spawn(
    env("LONGCTX_BIN"),
    ["serve", "--model", env("LONGCTX_MODEL_DIR"), "--device", "cpu", "--port", "0",
     "--max-model-len", "4096", "--served-model-name", "needle", ...args],
    { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...extraEnv } });
  let stderr = "";
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no 'listening' line in 60 s: " + stderr)), 60000);
    proc.stderr.on("data", (d) => {
      stderr += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on("exit", (code) => reject(new Error(`serve exited with ${code}: ${stderr}`)));
  });
  return {
    proc, port, url: `http://127.0.0.1:${port}`,
    async stop() {
      const exited = once(proc, "exit");
      proc.kill("SIGTERM");
      const [code, signal] = await exited;
      return { code, signal };
    },
  };
}
