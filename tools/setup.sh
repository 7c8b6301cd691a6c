#!/usr/bin/env bash
# Sets up a fresh machine: installs the Debian packages and builds the CPU configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_BUILD_TESTS=OFF >/dev/null
cmake --build build -j "$(nproc)" --target longctx
