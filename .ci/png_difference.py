#!/usr/bin/env python3
"""Compares two 8-bit PNG images pixel by pixel with Python's standard library alone (the README's first command
runs before any test package is installed): prints their largest and mean difference in 8-bit levels and exits 1
when the sizes differ or the largest difference exceeds --max-levels.

    .ci/png_difference.py output.png docs/images/shapes_default.png --max-levels 2
"""
import argparse
import struct
import sys
import zlib

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # gray, RGB, gray + alpha, RGBA


def read_png(path):
    """(width, height, channels, rows of bytes) of an 8-bit, non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, idat, header = 8, [], None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise ValueError(f"{path}: truncated {kind.decode(errors='replace')} chunk")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None:
        raise ValueError(f"{path}: no IHDR chunk")
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in CHANNELS or interlace != 0:
        raise ValueError(f"{path}: bit depth {depth}, colour type {color}, interlace {interlace}: "
                         "expected an 8-bit non-interlaced gray, RGB or RGBA image")
    channels = CHANNELS[color]
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    if len(raw) != height * (stride + 1):
        raise ValueError(f"{path}: {len(raw)} bytes of pixel data, expected {height * (stride + 1)}")
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                predictor = left if pa <= pb and pa <= pc else up if pb <= pc else up_left
                line[i] = (line[i] + predictor) & 255
            elif kind != 0:
                raise ValueError(f"{path}: row {y} has filter type {kind}")
        rows.append(line)
        previous = line
    return width, height, channels, rows


def rgb(rows, channels):
    """The RGB values of each pixel, in order (gray repeated, alpha dropped)."""
    for line in rows:
        for x in range(0, len(line), channels):
            if channels < 3:
                yield (line[x],) * 3
            else:
                yield tuple(line[x:x + 3])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("reference")
    parser.add_argument("--max-levels", type=int, default=0,
                        help="the largest difference allowed, in 8-bit levels (default 0: equal)")
    args = parser.parse_args()
    try:
        a = read_png(args.image)
        b = read_png(args.reference)
    except (OSError, ValueError, zlib.error) as e:
        print(f"png_difference: {e}", file=sys.stderr)
        return 1
    if a[:2] != b[:2]:
        print(f"png_difference: {args.image} is {a[0]}x{a[1]}, {args.reference} is {b[0]}x{b[1]}", file=sys.stderr)
        return 1
    largest, total, count = 0, 0, 0
    for p, q in zip(rgb(a[3], a[2]), rgb(b[3], b[2])):
        for u, v in zip(p, q):
            d = abs(u - v)
            largest = max(largest, d)
            total += d
            count += 1
    verdict = "within" if largest <= args.max_levels else "beyond"
    print(f"png_difference: {args.image} vs {args.reference}: largest {largest}, mean {total / count:.4f} "
          f"8-bit levels ({verdict} {args.max_levels})")
    return 0 if largest <= args.max_levels else 1


if __name__ == "__main__":
    sys.exit(main())
