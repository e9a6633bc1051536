#!/usr/bin/env python3
"""Writes kernelspec/logo-32x32.png and logo-64x64.png: a dark tile with a
bar chart in three colours (memory by category), drawn pixel by pixel and
encoded as PNG with zlib only. Run once; the PNGs are committed."""
import os, struct, zlib

def png(size, path):
    bg, fg = (24, 28, 40), [(230, 96, 80), (240, 180, 60), (90, 180, 120)]
    rows = []
    bars = [0.85, 0.55, 0.3]  # bar heights as a fraction of the tile
    for y in range(size):
        row = bytearray([0])  # filter: none
        for x in range(size):
            c = bg
            m = size // 8
            w = (size - 2 * m) // 3
            i = (x - m) // w if m <= x < size - m else -1
            if 0 <= i < 3 and (x - m) % w < w - max(1, size // 32) * 2:
                top = size - m - int(bars[i] * (size - 2 * m))
                if top <= y < size - m:
                    c = fg[i]
            row += bytes(c)
        rows.append(bytes(row))
    raw = b"".join(rows)
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)

here = os.path.dirname(os.path.abspath(__file__))
for s in (32, 64):
    png(s, os.path.join(here, f"logo-{s}x{s}.png"))
