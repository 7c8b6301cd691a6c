#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang + ASan + UBSan, in build-fuzz/) and runs each one
# after the other for a bounded time:
#   tools/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]     e.g. tools/fuzz.sh 3600 fuzz_config
# LONGCTX_FUZZ_RUNS=N also stops a target after N executions (issue 15's bar: 10M or an hour).
# The corpus of each target grows in build-fuzz/corpus/<target> across runs, seeded from
# fuzz/seeds/<target> and from the project's real files (checkpoint configs, the needle model's
# tokenizer, chat templates). A crash, a hang over 1 s, more than 2 GB of memory or a sanitizer
# report stops that target, leaves the input in build-fuzz/artifacts/ and fails the script.
# LONGCTX_FUZZ_TIMEOUT=S raises the hang limit for runs beside other work on a shared machine;
# every input over 1 s is still saved (slow-unit-*) so it can be re-timed alone.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
jobs=${LONGCTX_JOBS:-$(nproc)}
build=build-fuzz
all=(fuzz_token_ids fuzz_config fuzz_safetensors fuzz_tokenizer_json fuzz_tokenize
     fuzz_chat_template fuzz_openai_request)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")

if ! command -v clang++ >/dev/null 2>&1 ||
   ! clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  echo "tools/fuzz.sh needs clang with libFuzzer (Debian: apt-get install clang libclang-rt-dev)" >&2
  exit 2
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLONGCTX_FUZZ=ON -DLONGCTX_BUILD_TESTS=OFF -DLONGCTX_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

# Real files as extra seeds, refreshed on every run (never committed: fuzz/seeds stays small).
real=$build/real-seeds
rm -rf "$real"
mkdir -p "$real"/{config,tokenizer_json,chat_template}
for d in models/needle tests/data/fixtures/*/; do
  d=${d%/}
  for f in config.json generation_config.json; do
    [ -f "$d/$f" ] && cp "$d/$f" "$real/config/$(basename "$d")-$f"
  done
done
cp models/needle/tokenizer.json "$real/tokenizer_json/needle.json"
for cfg in models/needle/tokenizer_config.json build/test-data/tokenizers/*/tokenizer_config.json; do
  [ -f "$cfg" ] || continue
  name=$(basename "$(dirname "$cfg")")
  python3 -c 'import json, sys; t = json.load(open(sys.argv[1])).get("chat_template")
if isinstance(t, str): sys.stdout.write(t)' "$cfg" >"$real/chat_template/$name" || true
done
# safetensors: the committed seeds only; a real checkpoint (1.5 MB and up) is too slow per input.

failed=0
mkdir -p "$build/artifacts"
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  corpus=$build/corpus/$t
  mkdir -p "$corpus"
  seeds=()
  [ -d "fuzz/seeds/$name" ] && seeds+=("fuzz/seeds/$name")
  [ -d "$real/$name" ] && seeds+=("$real/$name")
  log=$build/$t.log
  start=$(date +%s)
  rc=0
  runs=()
  [ -n "${LONGCTX_FUZZ_RUNS:-}" ] && runs=(-runs="$LONGCTX_FUZZ_RUNS")
  "$build/fuzz/$t" -max_total_time="$seconds" "${runs[@]}" -timeout="${LONGCTX_FUZZ_TIMEOUT:-1}" \
    -report_slow_units=1 -rss_limit_mb=2048 -max_len=131072 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t-" "$corpus" "${seeds[@]}" \
    >"$log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  units=$(find "$corpus" -type f | wc -l)
  bytes=$(du -sb "$corpus" | cut -f1)
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "$t: FAILED (rc $rc) after ${elapsed}s; see $log and $build/artifacts/" >&2
    grep -m3 -E "ERROR|runtime error|Timeout|out-of-memory" "$log" >&2 || true
  fi
  echo "$t: ${execs:-?} execs in ${elapsed}s, corpus $units inputs / $bytes bytes, rc $rc"
done
exit $failed
