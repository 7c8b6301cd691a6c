// KV-cache events read as a router's indexer written in JavaScript reads vLLM's: npm `zeromq`
// (v6) subscribes to `longctx serve --kv-events-config`, npm `@msgpack/msgpack` decodes every
// EventBatch, gaps in the sequence numbers are filled from the replay socket, and the stream
// rebuilds the set of cached blocks. The run mixes what changes that set: a shared prefix
// (concurrent requests and a later hit), preemption (a 40-block KV cache that three long
// requests overflow) and aborts (clients that disconnect mid-stream). At the end the rebuilt set
// must equal the engine's own (GET /debug/kv_cache_blocks, served under --debug-kv-cache-blocks).
// The hash chain, replay equality and endpoint errors are kv_events_serve.py's.
// Environment: LONGCTX_BIN, LONGCTX_MODEL_DIR (models/needle), LONGCTX_NPM_DIR (the folder whose
// node_modules holds zeromq and @msgpack/msgpack; tools/fetch_test_data.sh).
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { env, startServer } from "./serve_helper.mjs";

const require = createRequire(env("LONGCTX_NPM_DIR") + "/package.json");
const zmq = require("zeromq");
const { decode } = require("@msgpack/msgpack");

const kBlock = 16;
const kTopic = "kv@needle";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// n token ids of needle's vocabulary, distinct per salt.
const documentIds = (salt, n) => Array.from({ length: n }, (_, i) => 3 + ((i * 37 + salt * 101) % 2000));

// seq (8 bytes, big endian, signed as the end marker -1 is) -> BigInt.
const seqOf = (frame) => Buffer.from(frame).readBigInt64BE(0);
const hashKey = (h) => BigInt(h).toString();  // hashes past 2^32 decode as BigInt, others as numbers

// Checks one batch against vLLM's KVEventBatch layout; returns its events.
function decodeBatch(payload) {
  const batch = decode(payload, { useBigInt64: true });
  assert.ok(Array.isArray(batch) && batch.length === 3, "a batch is [ts, events, rank]");
  const [ts, events, rank] = batch;
  assert.equal(typeof ts, "number");
  assert.ok(ts > 1.6e9, `ts ${ts}`);
  assert.equal(Number(rank), 0);
  assert.ok(events.length > 0, "an empty batch");
  for (const e of events) {
    if (e[0] === "BlockStored") {
      assert.equal(e.length, 8, "BlockStored has vLLM's 7 fields");
      const [, hashes, , tokens, blockSize, loraId, medium, loraName] = e;
      assert.equal(Number(blockSize), kBlock);
      assert.equal(tokens.length, hashes.length * kBlock);
      assert.equal(loraId, null);
      assert.equal(loraName, null);
      assert.equal(medium, "GPU");
    } else if (e[0] === "BlockRemoved") {
      assert.equal(e.length, 3);
      assert.equal(e[2], "GPU");
    } else {
      assert.deepEqual(e, ["AllBlocksCleared"]);
    }
  }
  return events;
}

let dir, server, sub;
const batches = new Map();  // seq -> payload
let receiving;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "longctx-kv-events-"));
  const events = {
    enable_kv_cache_events: true, publisher: "zmq", endpoint: `ipc://${dir}/pub`,
    replay_endpoint: `ipc://${dir}/replay`, topic: kTopic,
  };
  server = await startServer([
    "--block-size", String(kBlock), "--kv-cache-memory", "5MiB", "--max-num-seqs", "4",
    "--kv-events-config", JSON.stringify(events), "--debug-kv-cache-blocks",
  ]);
  sub = new zmq.Subscriber();
  sub.connect(events.endpoint);
  sub.subscribe(kTopic);
  receiving = (async () => {
    for await (const [topic, seq, payload] of sub) {
      assert.equal(Buffer.from(topic).toString(), kTopic);
      batches.set(seqOf(seq), Buffer.from(payload));
    }
  })().catch((e) => { if (!sub.closed) throw e; });
  await sleep(300);  // the subscription reaches the publisher
});

after(async () => {
  if (sub) sub.close();
  await receiving;
  if (server) {
    const { code } = await server.stop();
    assert.equal(code, 0);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function complete(prompt, maxTokens) {
  const res = await fetch(server.url + "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: "needle", prompt, max_tokens: maxTokens, temperature: 0,
                           ignore_eos: true }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  return res.json();
}

// A streamed request whose client goes away after its first chunks.
async function abandon(prompt) {
  const ac = new AbortController();
  const res = await fetch(server.url + "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, signal: ac.signal,
    body: JSON.stringify({ model: "needle", prompt, max_tokens: 300, temperature: 0,
                           ignore_eos: true, stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  let seen = 0;
  while (seen < 3) {
    const { done, value } = await reader.read();
    assert.ok(!done, "the stream ended before the client left");
    seen += new TextDecoder().decode(value).split("data: ").length - 1;
  }
  ac.abort();
  await reader.cancel().catch(() => {});
}

// A series' value; `label` (e.g. 'finished_reason="abort"') picks one of a family's series.
async function metric(name, label = "") {
  const text = await (await fetch(server.url + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + "{") && l.includes(label));
  assert.ok(line, `${name} ${label} not in /metrics`);
  return Number(line.slice(line.lastIndexOf(" ") + 1));
}

// The batches from `start` on, as the replay socket sends them (DEALER: the empty delimiter
// first, then the 8-byte start; answers [delimiter, seq, payload] up to seq -1).
async function replay(start) {
  const dealer = new zmq.Dealer({ receiveTimeout: 5000, linger: 0 });
  dealer.connect(`ipc://${dir}/replay`);
  const req = Buffer.alloc(8);
  req.writeBigInt64BE(start);
  await dealer.send([Buffer.alloc(0), req]);
  const out = new Map();
  for (;;) {
    const [delim, seq, payload] = await dealer.receive();
    assert.equal(delim.length, 0);
    if (seqOf(seq) === -1n) break;
    out.set(seqOf(seq), Buffer.from(payload));
  }
  dealer.close();
  return out;
}

test("the events rebuild the engine's cached blocks through prefix hits, preemption, aborts",
     async () => {
  // Prefix caching: two concurrent requests share a 96-token document, a third hits it later.
  const doc = documentIds(1, 96);
  const tail = (q) => Array.from({ length: 20 }, (_, i) => 500 + q * 30 + i);
  await Promise.all([complete([...doc, ...tail(0)], 4), complete([...doc, ...tail(1)], 4)]);
  await complete([...doc, ...tail(2)], 4);
  const hitsBefore = await metric("vllm:prefix_cache_hits_total");
  assert.ok(hitsBefore >= 96, `prefix cache hits ${hitsBefore}`);

  // Preemption: three requests of 150 + 150 tokens want 57 blocks of a 40-block cache.
  const preemptedBefore = await metric("vllm:num_preemptions_total");
  await Promise.all([2, 3, 4].map((s) => complete(documentIds(s * 7, 150), 150)));
  assert.ok(await metric("vllm:num_preemptions_total") > preemptedBefore, "nothing was preempted");

  // Aborts: clients that leave mid-stream, while another request runs to its end.
  await Promise.all([abandon(documentIds(40, 120)), abandon(documentIds(41, 70)),
                     complete(documentIds(42, 100), 30)]);

  // Idle: nothing running or waiting, and no batch for a while.
  let idle = false;
  for (let i = 0; i < 200 && !idle; ++i) {
    idle = await metric("vllm:num_requests_running") === 0 &&
           await metric("vllm:num_requests_waiting") === 0;
    if (!idle) await sleep(50);
  }
  assert.ok(idle, "requests still in flight after 10 s");
  assert.equal(await metric("vllm:request_success_total", 'finished_reason="abort"'), 2,
               "the two disconnected streams were aborted");
  let count = -1;
  while (count !== batches.size) {
    count = batches.size;
    await sleep(500);
  }
  assert.ok(batches.size > 0, "the subscriber received nothing");

  // Fill what the subscription missed (none expected; a consumer must handle it anyway).
  const last = [...batches.keys()].reduce((a, b) => (a > b ? a : b));
  const missing = [];
  for (let s = 0n; s <= last; ++s) if (!batches.has(s)) missing.push(s);
  if (missing.length > 0) {
    for (const [s, p] of await replay(missing[0])) if (!batches.has(s)) batches.set(s, p);
  }
  for (let s = 0n; s <= last; ++s) assert.ok(batches.has(s), `batch ${s} missing after replay`);

  const cached = new Set();
  let stored = 0, removed = 0;
  for (let s = 0n; s <= last; ++s) {
    for (const e of decodeBatch(batches.get(s))) {
      if (e[0] === "BlockStored") {
        for (const h of e[1]) {
          assert.ok(!cached.has(hashKey(h)), `${hashKey(h)} stored while cached`);
          cached.add(hashKey(h));
          ++stored;
        }
      } else if (e[0] === "BlockRemoved") {
        for (const h of e[1]) {
          assert.ok(cached.delete(hashKey(h)), `${hashKey(h)} removed while not cached`);
          ++removed;
        }
      } else {
        cached.clear();
      }
    }
  }
  assert.ok(removed > 0, "nothing was evicted");

  const res = await fetch(server.url + "/debug/kv_cache_blocks");
  assert.equal(res.status, 200);
  const engine = (await res.json()).block_hashes;
  assert.deepEqual([...cached].sort(), [...engine].sort(),
                   "the events' cached blocks differ from the engine's");
  console.log(`kv_events: ${batches.size} batches, ${stored} blocks stored, ${removed} removed, ` +
              `${cached.size} cached at the end (equal to the engine's)`);
});
