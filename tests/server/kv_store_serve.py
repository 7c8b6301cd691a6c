#!/usr/bin/env python3
"""Two `longctx serve` replicas over one redis-server (--kv-store), as a fleet runs them.

Replica A prefills a long document; replica B, which never saw it, answers the same request
from the store (its /metrics count the hits) with byte-identical output. With the store killed,
both replicas still answer every request, with A's and B's outputs equal. B's time to first
token (streamed) must be at least 5x lower than A's, which prefills the 3,000-token document.
Usage: kv_store_serve.py LONGCTX_BIN MODEL_DIR (Debian: redis-server; fails without it).
"""
import json
import shutil
import socket
import subprocess
import sys
import time

from serve_util import document, free_port, metric, post, serve

DOC_TOKENS = 3000
# Replica B's time to first token, from the store, against replica A's prefill of the document.
MIN_SPEEDUP = 5.0


def serve_store(binary, model, store):
    return serve(binary, model, ["--max-model-len", "4096", "--kv-store", store])


def stream(port, prompt):
    """A streamed greedy completion: (text, its tokens, the seconds to the first token)."""
    t0 = time.time()
    ttft, text, tokens = None, "", []
    with post(port, "/v1/completions", {"model": "needle", "prompt": prompt, "max_tokens": 8,
                                        "temperature": 0, "logprobs": 2, "ignore_eos": True,
                                        "stream": True}) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if ttft is None and choice.get("text"):
                ttft = time.time() - t0
            text += choice.get("text", "")
            tokens += (choice.get("logprobs") or {}).get("tokens", [])
    assert ttft is not None, "no token streamed"
    return text, tokens, ttft


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
        a, pa = serve_store(binary, model, store)
        procs.append(a)
        b, pb = serve_store(binary, model, store)
        procs.append(b)

        doc = document(1, DOC_TOKENS)
        text_a, tokens_a, ttft_a = stream(pa, doc)
        # Written behind: wait until A's written bytes are non-zero and stop growing.
        last, deadline = -1.0, time.time() + 20
        while time.time() < deadline:
            now = metric(pa, "longctx:kv_store_written_bytes_total")
            if now > 0 and now == last:
                break
            last = now
            time.sleep(0.3)
        text_b, tokens_b, ttft_b = stream(pb, doc)
        assert (text_b, tokens_b) == (text_a, tokens_a), (text_a, text_b)
        assert len(tokens_a) == 8, tokens_a
        hits = metric(pb, "longctx:kv_store_hits_total")
        assert hits == (DOC_TOKENS - 1) // 16, f"B read {hits} blocks"
        assert metric(pb, "longctx:kv_store_errors_total") == 0
        assert metric(pb, "vllm:prefix_cache_hits_total") >= 16 * hits
        print(f"kv_store_serve: A's TTFT {ttft_a:.3f} s ({DOC_TOKENS} tokens computed), B's "
              f"{ttft_b:.3f} s ({hits:.0f} blocks read from the store): {ttft_a / ttft_b:.1f}x")
        assert ttft_a >= MIN_SPEEDUP * ttft_b, (
            f"B's TTFT from the store is only {ttft_a / ttft_b:.1f}x lower than A's prefill "
            f"(at least {MIN_SPEEDUP}x expected)")

        redis.kill()
        redis.wait()
        other = document(2, 300)
        text_a, tokens_a, _ = stream(pa, other)
        text_b, tokens_b, _ = stream(pb, other)
        assert (text_b, tokens_b) == (text_a, tokens_a), (text_a, text_b)
        assert metric(pb, "longctx:kv_store_errors_total") > 0
        assert metric(pa, "longctx:kv_store_errors_total") > 0
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
