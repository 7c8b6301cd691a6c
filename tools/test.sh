#!/usr/bin/env bash
# The test command: builds the CPU configuration and runs every CPU test under ctest, then
# builds the CUDA configuration (compile-only where there is no GPU) so CUDA breaks show in CI,
# then runs the README's quick start in a fresh clone, then runs every libFuzzer target for
# LONGCTX_FUZZ_SECONDS (default 30) each.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${LONGCTX_JOBS:-$(nproc)}
bash tools/install_deps.sh
bash tools/fetch_test_data.sh
# ccache, with paths relative to this tree, lets tools/check_quickstart.sh rebuild a fresh clone
# from this build's objects.
export CCACHE_BASEDIR=$PWD
launcher=()
command -v ccache >/dev/null 2>&1 &&
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The Python package and its pytest suites use the interpreter Debian's python3-pytest,
# python3-numpy and python3-torch belong to (a python3 earlier on the PATH may lack them).
python=()
[ -x /usr/bin/python3 ] && python=(-DPython3_EXECUTABLE=/usr/bin/python3)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${python[@]}" >/dev/null
cmake --build build -j "$jobs"
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=$PATH:/usr/local/cuda/bin
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_CUDA=ON "${python[@]}" \
    >/dev/null
  cmake --build build-cuda -j "$jobs"
else
  echo "nvcc not found: skipping the CUDA build" >&2
fi
ctest --test-dir build -L cpu --output-on-failure -j "$jobs"
# The README's quick start verbatim in a fresh clone with no ../shared, and from an installed prefix.
bash tools/check_quickstart.sh
# Every fuzz target for a short bounded time; a crash, hang, OOM or sanitizer report fails the
# run (docs/fuzzing.md; the long runs: tools/fuzz.sh 3600).
LONGCTX_JOBS=$jobs bash tools/fuzz.sh "${LONGCTX_FUZZ_SECONDS:-30}"
