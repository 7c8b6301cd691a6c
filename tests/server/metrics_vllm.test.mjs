// `/metrics` as routers and vLLM's dashboards read it: `longctx serve` on the CPU with
// models/needle, its exposition parsed by an independent parser (npm
// parse-prometheus-text-format) and checked against tests/server/vllm_metrics.json (vLLM's
// names, types, label sets and buckets, with their source): before any request (values from
// start-up), after a few requests (counters and histogram counts equal to what the responses
// report), and /health and /ping while a SIGTERM drain runs.
// Environment: LONGCTX_BIN, LONGCTX_MODEL_DIR (models/needle), LONGCTX_NPM_DIR (the folder whose
// node_modules holds parse-prometheus-text-format; tools/fetch_test_data.sh).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { env, needleQuestion, startServer } from "./serve_helper.mjs";

const require = createRequire(env("LONGCTX_NPM_DIR") + "/package.json");
const parsePrometheusTextFormat = require("parse-prometheus-text-format");

const table = JSON.parse(readFileSync(new URL("./vllm_metrics.json", import.meta.url), "utf8"));
const kMaxModelLen = 4096;  // serve_helper's --max-model-len
const kModel = "needle";    // serve_helper's --served-model-name

// vLLM's build_1_2_5_buckets(max_value).
function buckets125(max) {
  const out = [];
  for (let scale = 1; ; scale *= 10)
    for (const m of [1, 2, 5]) {
      if (m * scale > max) return out;
      out.push(m * scale);
    }
}

async function scrape(server) {
  const res = await fetch(server.url + "/metrics");
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type"), /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  const families = new Map();
  for (const f of parsePrometheusTextFormat(text)) {
    assert.ok(!families.has(f.name), `family ${f.name} twice`);
    families.set(f.name, f);
  }
  return { text, families };
}

// The parser folds a labeled histogram into its buckets (dropping the labels, _sum and
// _count), so the histograms' label sets are read from their sample lines.
function histogramSamples(text, name) {
  const out = [];
  const re = new RegExp(`^${name.replace(/[:]/g, "\\:")}_(bucket|sum|count)\\{([^}]*)\\} (\\S+)$`, "gm");
  for (const m of text.matchAll(re)) {
    const labels = {};
    for (const kv of m[2].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[kv[1]] = kv[2];
    out.push({ kind: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function value(families, name, labels = {}) {
  const f = families.get(name);
  assert.ok(f, `${name} missing`);
  const hits = f.metrics.filter((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  assert.equal(hits.length, 1, `${name} ${JSON.stringify(labels)}: ${hits.length} series`);
  return Number(hits[0].value);
}

function histogram(text, name) {
  const s = histogramSamples(text, name);
  const pick = (kind) => s.filter((x) => x.kind === kind);
  assert.equal(pick("sum").length, 1, `${name}_sum`);
  assert.equal(pick("count").length, 1, `${name}_count`);
  const inf = pick("bucket").find((x) => x.labels.le === "+Inf");
  assert.ok(inf, `${name} +Inf bucket`);
  assert.equal(inf.value, pick("count")[0].value, `${name}: +Inf bucket = count`);
  return { count: pick("count")[0].value, sum: pick("sum")[0].value };
}

// Every series of vllm_metrics.json with vLLM's type, labels and buckets; every series of the
// whole exposition (longctx's own too) labeled with the served model name.
function checkShape({ text, families }) {
  for (const want of table.metrics) {
    const f = families.get(want.name);
    assert.ok(f, `${want.name} is not exported`);
    assert.equal(f.type, want.type.toUpperCase(), `${want.name} type`);
    if (want.type === "histogram") {
      const samples = histogramSamples(text, want.name);
      assert.ok(samples.length > 0, `${want.name} has no samples`);
      for (const s of samples) {
        const keys = Object.keys(s.labels).filter((k) => k !== "le").sort();
        assert.deepEqual(keys, [...want.labels].sort(), `${want.name}_${s.kind} labels`);
        assert.equal(s.labels.model_name, kModel);
        assert.equal(s.labels.engine, "0");
      }
      const bounds = Array.isArray(want.buckets) ? want.buckets : buckets125(kMaxModelLen);
      const got = Object.keys(f.metrics[0].buckets);
      assert.deepEqual(got.filter((le) => le !== "+Inf").map(Number), bounds, `${want.name} buckets`);
      assert.ok(got.includes("+Inf"), `${want.name} +Inf bucket`);
    } else {
      assert.ok(f.metrics.length > 0, `${want.name} has no samples`);
      for (const s of f.metrics) {
        assert.deepEqual(Object.keys(s.labels).sort(), [...want.labels].sort(), `${want.name} labels`);
        assert.equal(s.labels.model_name, kModel);
        assert.equal(s.labels.engine, "0");
      }
    }
  }
  for (const [name, f] of families) {
    assert.match(name, /^(vllm|longctx):/, `${name}: neither vLLM's nor longctx's prefix`);
    if (f.type === "HISTOGRAM") {
      for (const s of histogramSamples(text, name)) assert.equal(s.labels.model_name, kModel, name);
    } else {
      for (const s of f.metrics) assert.equal(s.labels?.model_name, kModel, name);
    }
  }
}

const histograms = table.metrics.filter((m) => m.type === "histogram").map((m) => m.name);
const L = { model_name: kModel, engine: "0" };

let server;
before(async () => { server = await startServer([]); });
after(async () => { if (server) await server.stop(); });

test("ready as soon as the port is open: /health and /ping 200", async () => {
  // serve loads the model before it opens the port, so there is no 'loading' window to probe.
  assert.equal((await fetch(server.url + "/health")).status, 200);
  assert.equal((await fetch(server.url + "/ping")).status, 200);
  assert.equal((await fetch(server.url + "/ping", { method: "POST" })).status, 200);
  assert.equal((await fetch(server.url + "/ping", { method: "PUT" })).status, 405);
});

test("before any request: every vLLM series, start-up values", async () => {
  const m = await scrape(server);
  checkShape(m);
  const f = m.families;
  assert.equal(value(f, "vllm:num_requests_running", L), 0);
  assert.equal(value(f, "vllm:num_requests_waiting", L), 0);
  assert.equal(value(f, "vllm:kv_cache_usage_perc", L), 0);
  assert.equal(value(f, "vllm:gpu_cache_usage_perc", L), 0);
  const blocks = value(f, "longctx:kv_blocks_total", L);
  assert.ok(blocks > 0, `KV block total ${blocks} before the first request`);
  const info = f.get("vllm:cache_config_info").metrics[0];
  assert.equal(Number(info.value), 1);
  assert.equal(Number(info.labels.num_gpu_blocks), blocks);
  assert.ok(Number(info.labels.block_size) > 0);
  assert.equal(info.labels.enable_prefix_caching, "True");
  for (const c of table.metrics.filter((x) => x.type === "counter"))
    for (const s of f.get(c.name).metrics) assert.equal(Number(s.value), 0, c.name);
  for (const h of histograms) assert.equal(histogram(m.text, h).count, 0, h);
});

test("after requests: counters and histograms agree with the responses", async () => {
  const post = async (path, body) => {
    const res = await fetch(server.url + path, {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
    });
    assert.equal(res.status, 200);
    return res.json();
  };
  const outs = [];
  // The same prompt twice: the second reads its full blocks from the prefix cache.
  for (let i = 0; i < 2; ++i)
    outs.push(await post("/v1/completions", { model: kModel, prompt: needleQuestion, max_tokens: 8 }));
  outs.push(await post("/v1/completions", { model: kModel, prompt: "Hello", max_tokens: 5, ignore_eos: true }));
  outs.push(await post("/v1/chat/completions", {
    model: kModel, messages: [{ role: "user", content: needleQuestion }], max_tokens: 30 }));
  const n = outs.length;
  const prompt = outs.reduce((a, o) => a + o.usage.prompt_tokens, 0);
  const generated = outs.reduce((a, o) => a + o.usage.completion_tokens, 0);
  const intervals = outs.reduce((a, o) => a + Math.max(0, o.usage.completion_tokens - 1), 0);
  const reasons = {};
  for (const o of outs) reasons[o.choices[0].finish_reason] = (reasons[o.choices[0].finish_reason] ?? 0) + 1;

  // A finish is counted by the request's handler just after its response went out.
  let m;
  for (let i = 0; i < 500; ++i) {
    m = await scrape(server);
    const done = ["stop", "length", "abort"].reduce(
      (a, r) => a + value(m.families, "vllm:request_success_total", { ...L, finished_reason: r }), 0);
    if (done === n) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  checkShape(m);
  const f = m.families;
  for (const r of ["stop", "length", "abort"])
    assert.equal(value(f, "vllm:request_success_total", { ...L, finished_reason: r }), reasons[r] ?? 0, r);
  assert.equal(value(f, "vllm:prompt_tokens_total", L), prompt);
  assert.equal(value(f, "vllm:generation_tokens_total", L), generated);
  for (const h of ["vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                   "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
                   "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"]) {
    const { count, sum } = histogram(m.text, h);
    assert.equal(count, n, h);
    assert.ok(sum >= 0, h);
  }
  for (const h of ["vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"])
    assert.equal(histogram(m.text, h).count, intervals, h);
  assert.deepEqual(histogram(m.text, "vllm:request_prompt_tokens"), { count: n, sum: prompt });
  assert.deepEqual(histogram(m.text, "vllm:request_generation_tokens"), { count: n, sum: generated });
  const queries = value(f, "vllm:prefix_cache_queries_total", L);
  const hits = value(f, "vllm:prefix_cache_hits_total", L);
  assert.ok(hits > 0 && hits <= queries, `prefix cache hits ${hits} of ${queries}`);
  assert.equal(value(f, "vllm:gpu_prefix_cache_hits_total", L), hits);
  // Nothing in flight: no request counted, no block held.
  assert.equal(value(f, "vllm:num_requests_running", L), 0);
  assert.equal(value(f, "vllm:num_requests_waiting", L), 0);
  assert.equal(value(f, "vllm:kv_cache_usage_perc", L), 0);
});

test("SIGTERM drain: /health and /ping 503 while a stream finishes, new requests 503", async () => {
  const res = await fetch(server.url + "/v1/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: kModel, prompt: "Hello", max_tokens: 400, ignore_eos: true, stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  await reader.read();  // the stream is under way
  const exited = server.stop();
  let health = 200;
  for (let i = 0; i < 500 && health === 200; ++i) {
    health = (await fetch(server.url + "/health")).status;
    if (health === 200) await new Promise((r) => setTimeout(r, 5));
  }
  assert.equal(health, 503);
  assert.equal((await fetch(server.url + "/ping")).status, 503);
  const refused = await fetch(server.url + "/v1/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: kModel, prompt: "Hello", max_tokens: 2 }),
  });
  assert.equal(refused.status, 503);
  let text = "";
  const decoder = new TextDecoder();
  for (;;) {
    const { done, value: chunk } = await reader.read();
    if (done) break;
    text += decoder.decode(chunk);
  }
  assert.match(text, /"finish_reason":"length"/);  // it finished, not aborted
  assert.match(text, /data: \[DONE\]/);
  const { code } = await exited;
  assert.equal(code, 0);
  server = null;
});
