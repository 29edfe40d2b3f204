"""Compares two 8-bit PNG images (as `kiln generate` writes them) with the standard library only (the GPU
machines may lack PIL): prints `max=<largest per-channel difference in levels> mean=<mean difference>`.
Usage: python3 bench/image_diff.py a.png b.png
"""
import struct
import sys
import zlib


def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0, f"{path}: only 8-bit non-interlaced PNGs"
            channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        f, cur = line[0], bytearray(line[1:])
        for i in range(stride):
            a = cur[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                cur[i] = (cur[i] + a) & 255
            elif f == 2:
                cur[i] = (cur[i] + b) & 255
            elif f == 3:
                cur[i] = (cur[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(cur)
        prev = cur
    return (width, height, channels), b"".join(rows)


def main(a, b):
    (sa, pa), (sb, pb) = read_png(a), read_png(b)
    if sa != sb:
        sys.exit(f"{a} is {sa}, {b} is {sb}")
    diffs = [abs(x - y) for x, y in zip(pa, pb)]
    print(f"max={max(diffs)} mean={sum(diffs) / len(diffs):.3f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
