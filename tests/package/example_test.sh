#!/usr/bin/env bash
# `cmake --install` gives a CMake package that a project outside the tree builds against: install this build
# into a fresh prefix, build examples/cpp with find_package(Kiln), and run it on a tiny model.
set -euo pipefail
build="$1"
source="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/examples/cpp" -B "$work/example" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/example" -j 2 >/dev/null
"$work/example/generate_image" "$source/tests/data/models/flux-tiny-schnell" "a red circle" "$work/out.png" 2 32
python3 - "$work/out.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (32, 32), (width, height)
assert b"tEXt" in data or b"iTXt" in data, "the parameters are not in the PNG's text chunks"
print("example: 32x32 PNG with its parameters")
PY
