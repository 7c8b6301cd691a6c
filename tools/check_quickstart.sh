#!/usr/bin/env bash
# The README's quick start, verbatim, in a fresh clone with nothing beside it (no ../shared), then
# the same job from `cmake --install`'s prefix run in another directory. Each must print the answer
# the prompt generator expects (it writes it on stderr). tools/test.sh runs this after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# Inside the build folder: ignored by git, and no sibling `shared` folder beside the clone.
work=$repo/build/quickstart
rm -rf "$work"
mkdir -p "$work/elsewhere"
git clone -q "$repo" "$work/longctx"
cd "$work/longctx"

fail() {
  echo "quick start: $1" >&2
  sed 's/^/  | /' "$2" >&2
  exit 1
}
# Each tree's paths are relative to its own root for ccache, so the clone's build reuses the
# objects of the build that ran before it (a no-op where ccache is absent).
export CCACHE_BASEDIR=$PWD
# The first ```sh block under "## Quick start" of the clone's README.
cmd=$(awk '/^## Quick start/{q=1} q && /^```sh/{f=1; next} f && /^```/{exit} f' README.md)
[ -n "$cmd" ] || fail "no sh block under '## Quick start' in README.md" README.md
start=$(date +%s)
bash -c "$cmd" >"$work/out" 2>"$work/err" || fail "the README's command failed" "$work/err"
seconds=$(($(date +%s) - start))
expected=$(sed -n "s/^expected answer: '\(.*\)' (.*/\1/p" "$work/err")
[ -n "$expected" ] || fail "the generator printed no expected answer" "$work/err"
got=$(tail -n 1 "$work/out")  # after the build's progress lines
[ "$got" = "$expected" ] || fail "printed '$got', expected '$expected'" "$work/out"
echo "quick start in a fresh clone: printed '$got' as expected (${seconds} s, build included)"

# The installed tree, used from a directory that is not the repository.
cmake --install build --prefix "$work/prefix" >/dev/null
cd "$work/elsewhere"
share=$work/prefix/share/longctx
python3 "$share/tools/needle_model/needle_data.py" --task niah_single --haystack noise \
  --length 2048 --print-prompt 2>"$work/err2" |
  "$work/prefix/bin/longctx" generate --model "$share/models/needle" --temperature 0 \
    --max-tokens 12 --prompt-file - >"$work/out2" 2>>"$work/err2" ||
  fail "the installed binary failed" "$work/err2"
got=$(head -n 1 "$work/out2")
[ "$got" = "$expected" ] || fail "installed: printed '$got', expected '$expected'" "$work/out2"
echo "installed prefix: printed '$got' as expected"
