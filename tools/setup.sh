#!/usr/bin/env bash
# Sets up a fresh machine: installs the Debian packages and builds the CPU configuration: the
# `longctx` CLI and the Python package (build/python: PYTHONPATH=build/python; docs/python.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
# ccache (installed by install_deps.sh) makes a rebuild of an unchanged tree take seconds.
launcher=()
command -v ccache >/dev/null 2>&1 &&
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The Python package is built for the interpreter Debian's python3-* packages belong to (a
# python3 earlier on the PATH, e.g. pyenv's, has no python3-torch).
python=()
[ -x /usr/bin/python3 ] && python=(-DPython3_EXECUTABLE=/usr/bin/python3)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_BUILD_TESTS=OFF "${launcher[@]}" \
  "${python[@]}" >/dev/null
cmake --build build -j "$(nproc)" --target longctx longctx_python
