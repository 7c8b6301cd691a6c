"""What the Python server tests share: starting `longctx serve` on a free port, completions,
/metrics values and the synthetic token-id documents."""
import json
import re
import socket
import subprocess
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, model, args):
    """`longctx serve` on the needle model (CPU, a free port) with `args` added. Returns
    (process, port) once it listens, or (process, its log) when it exits first."""
    proc = subprocess.Popen(
        [binary, "serve", "--model", model, "--device", "cpu", "--port", "0",
         "--served-model-name", "needle", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = ""
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log += line
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    return proc, log


def serve(binary, model, args):
    """start(), failing with the server's log when it does not come up."""
    proc, port = start(binary, model, args)
    assert isinstance(port, int), f"serve did not start: {port}"
    return proc, port


def post(port, path, body, timeout=120):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def complete(port, prompt, max_tokens=2, **fields):
    with post(port, "/v1/completions", {"model": "needle", "prompt": prompt,
                                        "max_tokens": max_tokens, "temperature": 0,
                                        **fields}) as r:
        assert r.status == 200, r.status
        return json.load(r)


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def document(salt, n):
    """n token ids of the needle model's vocabulary, distinct per salt."""
    return [3 + (i * 37 + salt * 101) % 2000 for i in range(n)]
