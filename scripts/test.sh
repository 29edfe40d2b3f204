#!/usr/bin/env bash
# Builds Kiln with warnings as errors and runs every test; then rebuilds the file loaders', the tokenizers' and
# kiln serve's tests (untrusted files, text and requests; the server's threads) and the fuzz targets' corpus
# replays under AddressSanitizer and UndefinedBehaviorSanitizer and runs them again; then builds the libFuzzer
# targets with clang and fuzzes each briefly (KILN_FUZZ_SECONDS, default 15; docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh -DKILN_WERROR=ON
(cd build && ctest --output-on-failure -j "$(nproc)")

export CCACHE_BASEDIR="$PWD"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_WERROR=ON -DKILN_BUILD_BENCH=OFF >/dev/null
cmake --build build-sanitize -j "$(nproc)" --target kiln_test_io kiln_test_tokenizers kiln_test_serve kiln_fuzz
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -L "io|tokenizers|serve|fuzz")

CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON -DKILN_BUILD_TESTS=OFF \
    -DKILN_BUILD_BENCH=OFF -DKILN_FUZZ_SECONDS="${KILN_FUZZ_SECONDS:-15}" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target kiln_fuzz
(cd build-fuzz && ctest --output-on-failure -L fuzz)
