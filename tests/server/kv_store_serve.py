#!/usr/bin/env python3
"""Two `longctx serve` replicas over one redis-server (--kv-store), as a fleet runs them.

Replica A prefills a long document; replica B, which never saw it, answers the same request
from the store (its /metrics count the hits) with byte-identical output. With the store killed,
both replicas still answer every request, with A's and B's outputs equal. TTFTs are printed
(the CPU backend on a shared machine is too noisy for a ratio to be a test).
Usage: kv_store_serve.py LONGCTX_BIN MODEL_DIR (Debian: redis-server; fails without it).
"""
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(binary, model, store):
    proc = subprocess.Popen(
        [binary, "serve", "--model", model, "--device", "cpu", "--port", "0",
         "--max-model-len", "2048", "--served-model-name", "needle", "--kv-store", store],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    log = ""
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log += line
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    raise AssertionError(f"serve did not start: {log}")


def complete(port, prompt):
    body = json.dumps({"model": "needle", "prompt": prompt, "max_tokens": 8, "temperature": 0,
                       "logprobs": 2}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.load(r)
    choice = out["choices"][0]
    return choice["text"], choice["logprobs"]["tokens"], time.time() - t0


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def document(salt, n):
    return [3 + (i * 37 + salt * 101) % 2000 for i in range(n)]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    redis_bin = shutil.which("redis-server")
    assert redis_bin, "redis-server is missing (Debian: redis-server, tools/install_deps.sh)"
    port = free_port()
    redis = subprocess.Popen([redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    store = f"redis://127.0.0.1:{port}"
    procs = [redis]
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        a, pa = serve(binary, model, store)
        procs.append(a)
        b, pb = serve(binary, model, store)
        procs.append(b)

        doc = document(1, 1500)
        text_a, tokens_a, ttft_a = complete(pa, doc)
        # Written behind: wait until A's written bytes are non-zero and stop growing.
        last, deadline = -1.0, time.time() + 20
        while time.time() < deadline:
            now = metric(pa, "longctx:kv_store_written_bytes_total")
            if now > 0 and now == last:
                break
            last = now
            time.sleep(0.3)
        text_b, tokens_b, ttft_b = complete(pb, doc)
        assert (text_b, tokens_b) == (text_a, tokens_a), (text_a, text_b)
        hits = metric(pb, "longctx:kv_store_hits_total")
        assert hits >= 1499 // 16 - 1, f"B read {hits} blocks"
        assert metric(pb, "longctx:kv_store_errors_total") == 0
        assert metric(pb, "vllm:prefix_cache_hits_total") >= 16 * hits
        print(f"kv_store_serve: A computed 1500 tokens in {ttft_a:.3f} s, B read {hits:.0f} "
              f"blocks from the store in {ttft_b:.3f} s ({ttft_a / ttft_b:.1f}x)")

        redis.kill()
        redis.wait()
        other = document(2, 300)
        text_a, tokens_a, _ = complete(pa, other)
        text_b, tokens_b, _ = complete(pb, other)
        assert (text_b, tokens_b) == (text_a, tokens_a), (text_a, text_b)
        assert metric(pb, "longctx:kv_store_errors_total") > 0
        assert metric(pa, "longctx:kv_store_errors_total") > 0
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
