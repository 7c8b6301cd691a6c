#!/usr/bin/env python3
"""KV-cache events from `longctx serve` read as vLLM's consumers read them.

A real server (models/needle on the CPU, a small KV cache) publishes on ZeroMQ; this script
subscribes with pyzmq, decodes every batch with the msgpack package (an encoder independent of
the server's msgpack-cxx) into vLLM's KVEventBatch layout, and checks:
- two concurrent requests sharing a document store its blocks once; later prompts evict them;
- every BlockStored's hashes are the documented chain, xxhash64 of the block's int32 token ids
  (little endian) seeded by the parent's hash (python3-xxhash recomputes them);
- the stream, replayed from the ROUTER socket, is gapless from 0 and equal to the live batches;
- a second server on the same endpoint fails at start-up naming it;
- without --debug-kv-cache-blocks, /debug/kv_cache_blocks is 404.
(kv_events.test.mjs checks the stream against the server's own cached blocks.)
Usage: kv_events_serve.py LONGCTX_BIN MODEL_DIR (Debian: python3-zmq python3-msgpack
python3-xxhash).
"""
import json
import signal
import struct
import sys
import threading
import time
import urllib.error
import urllib.request

import msgpack
import xxhash
import zmq

from serve_util import complete, document, free_port, start

BLOCK = 16


def start_events(binary, model, events):
    return start(binary, model, ["--max-model-len", "512", "--block-size", str(BLOCK),
                                 "--kv-cache-memory", "5MiB", "--kv-events-config",
                                 json.dumps(events)])


def chain(tokens, parent):
    out = []
    for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        parent = xxhash.xxh64_intdigest(struct.pack(f"<{BLOCK}i", *tokens[i:i + BLOCK]),
                                        seed=parent)
        out.append(parent)
    return out


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, rank = batch
    assert isinstance(ts, float) and ts > 1.6e9, ts
    assert rank == 0, rank
    assert events, "an empty batch"
    for e in events:
        tag = e[0]
        if tag == "BlockStored":
            assert len(e) == 8, e
            _, hashes, parent, tokens, block_size, lora_id, medium, lora_name = e
            assert block_size == BLOCK and lora_id is None and lora_name is None, e
            assert medium == "GPU", medium
            assert len(tokens) == len(hashes) * BLOCK
            assert chain(tokens, parent or 0) == hashes, "hash chain"
        elif tag == "BlockRemoved":
            assert len(e) == 3 and e[2] == "GPU", e
        else:
            assert e == ["AllBlocksCleared"], e
    return events


def replay(ctx, endpoint, start_seq):
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
    out = {}
    while True:
        delim, seq, payload = dealer.recv_multipart()
        assert delim == b""
        seq = int.from_bytes(seq, "big", signed=True)
        if seq == -1:
            assert payload == b""
            dealer.close()
            return out
        out[seq] = payload


def main():
    binary, model = sys.argv[1], sys.argv[2]
    pub_port, replay_port = free_port(), free_port()
    events = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{pub_port}", "replay_endpoint": f"tcp://*:{replay_port}",
              "topic": "kv"}
    proc, port = start_events(binary, model, events)
    assert isinstance(port, int), f"serve did not start: {port}"
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.setsockopt(zmq.RCVTIMEO, 700)
        sub.connect(f"tcp://127.0.0.1:{pub_port}")
        time.sleep(0.3)

        # A second server on the same endpoints fails at start-up, naming the endpoint.
        other, log = start_events(binary, model, events)
        assert not isinstance(log, int), "a second server started on the same endpoint"
        assert other.returncode != 0
        assert f"cannot bind the PUB socket to tcp://*:{pub_port}" in log, log

        # The cached blocks' debug endpoint exists only under --debug-kv-cache-blocks.
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/kv_cache_blocks", timeout=10)
            raise AssertionError("/debug/kv_cache_blocks answered without the flag")
        except urllib.error.HTTPError as e:
            assert e.code == 404, e.code

        doc = document(1, 96)
        tails = [[500 + q * 30 + i for i in range(20)] for q in range(3)]
        failures = []

        def run(prompt):
            try:
                complete(port, prompt)
            except Exception as e:  # reported by the main thread
                failures.append(e)

        threads = [threading.Thread(target=run, args=(doc + tails[q],)) for q in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        complete(port, doc + tails[2])  # hits: nothing of the document is stored again
        for s in range(2, 6):  # 300 tokens each over a 40-block cache: the document is evicted
            complete(port, document(s * 7, 300))

        live = {}
        while True:
            try:
                topic, seq, payload = sub.recv_multipart()
            except zmq.Again:
                break
            assert topic == b"kv"
            live[int.from_bytes(seq, "big")] = payload
        assert live, "the subscriber received nothing"

        every = replay(ctx, f"tcp://127.0.0.1:{replay_port}", 0)
        assert sorted(every) == list(range(len(every))), "replayed sequence numbers have gaps"
        for seq, payload in live.items():
            assert every[seq] == payload, f"live batch {seq} differs from its replay"

        cached, stored, removed = set(), {}, 0
        for seq in sorted(every):
            for e in decode(every[seq]):
                if e[0] == "BlockStored":
                    for h in e[1]:
                        assert h not in cached, f"{h} stored while cached"
                        cached.add(h)
                        stored[h] = stored.get(h, 0) + 1
                elif e[0] == "BlockRemoved":
                    for h in e[1]:
                        assert h in cached, f"{h} removed while not cached"
                        cached.remove(h)
                        removed += 1
                else:
                    cached.clear()
        doc_hashes = chain(doc, 0)
        assert [stored.get(h) for h in doc_hashes] == [1] * 6, "the document is stored once"
        assert not cached & set(doc_hashes), "the document was evicted"
        assert removed > 0
        # What is still cached is exactly the last prompts' full blocks that fit.
        later = set()
        for s in range(2, 6):
            later |= set(chain(document(s * 7, 300)[:288], 0))
        assert cached <= later | set(chain(doc + tails[2], 0)), "unexpected cached blocks"
        print(f"kv_events_serve: {len(every)} batches ({len(live)} live), {sum(stored.values())} "
              f"blocks stored, {removed} removed, {len(cached)} cached at the end")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        ctx.destroy(linger=0)
    assert code == 0, f"serve exited with {code}"


if __name__ == "__main__":
    main()
