#!/usr/bin/env bash
# Configures and builds the `kiln` command (and the library it links) into build/ (Release): what the README's
# first command runs, and nothing more. Extra arguments go to CMake's configure step. scripts/test.sh builds
# everything else (tests, benchmarks, the Python package).
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout in ccache's keys, so that another clone (CI's) reuses the cached objects.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF "$@" >/dev/null
cmake --build build -j "$(nproc)" --target kiln_cli
