#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Rounds a llama2.c checkpoint's weight matrices through llama.cpp's Q4_0 grid, written anew from
its description (ggml's quantize_row_q4_0_ref and dequantize_row_q4_0), and writes the checkpoint
back in float32: what llama.cpp's plain Q4_0 does to the same model, to compare our 4-bit schemes
with. Python 3 standard library only.

  q4_0_ref.py IN.bin OUT.bin [--skip-embd]

Q4_0: blocks of 32 consecutive weights along a row (the input dimension). max is the weight of
largest magnitude, with its sign (the first one on a tie); d = max / -8, id = 1/d (0 when d is 0),
q = min(15, trunc(x * id + 8.5)), each step in float32 as the C does it; the block keeps d as
fp16, so a weight reads back as (q - 8) * fp16(d). The code -8 is reached (at max itself), +8 is
clamped to +7: the grid is -8..7 steps of |d|, its long side towards max.

Rounded: the token embedding (the head too where it is tied), wq, wk, wv, wo, w1, w2, w3 and a
separate classifier; the RMS norms and the RoPE tables are copied as they are. --skip-embd copies
the embedding and classifier as well. A row whose length is no multiple of 32 (w2 of stories260K:
172 = 5 x 32 + 12) ends in a short block rounded by the same rule, as though padded with zeros
(which change no block's max): llama-quantize itself refuses Q4_0 for such a tensor
("Unsupported tensor size encountered"), and this is how our own schemes treat the tail.
"""
import argparse
import struct
import sys
from array import array

QK = 32


def f32(v):
    """@v rounded to float32."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def q4_0_block(x):
    """One Q4_0 block of the float32 values @x (at most 32): returns (d, q), d the scale as read
    back from fp16 and q the 4-bit codes 0..15; weight i reads back as (q[i] - 8) * d."""
    amax, mx = 0.0, 0.0
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    d = f32(mx / -8.0)
    idv = f32(1.0 / d) if d else 0.0
    # float32 products and sums: each is exact in double, so rounding once gives C's float result
    scaled = array("f", [v * idv for v in x])
    shifted = array("f", [s + 8.5 for s in scaled])
    q = [min(15, max(0, int(s))) for s in shifted]  # int() truncates, as the C cast does
    return struct.unpack("<e", struct.pack("<e", d))[0], q


def q4_0_round(x):
    """@x (float32 values) rounded through one Q4_0 block: the values it reads back as."""
    d, q = q4_0_block(x)
    return [(c - 8) * d for c in q]


def round_matrix(w, off, count, cols):
    """Rounds @count weights of @w (array 'f') from @off in place: rows of @cols, 32-blocks."""
    for r in range(off, off + count, cols):
        for b in range(r, r + cols, QK):
            e = min(b + QK, r + cols)
            w[b:e] = array("f", q4_0_round(w[b:e]))


def tensors(h):
    """The float32 arrays of a llama2.c checkpoint with header @h, in run.c's order: (name,
    count, cols) - cols 0 for those that are not weight matrices."""
    dim, hid, L, heads, kv_heads, vocab, seq_len = h
    V, hs = abs(vocab), dim // heads
    kv = kv_heads * hs
    t = [("token_embedding", V * dim, dim), ("rms_att", L * dim, 0),
         ("wq", L * dim * dim, dim), ("wk", L * kv * dim, dim), ("wv", L * kv * dim, dim),
         ("wo", L * dim * dim, dim), ("rms_ffn", L * dim, 0), ("w1", L * hid * dim, dim),
         ("w2", L * dim * hid, hid), ("w3", L * hid * dim, dim), ("rms_final", dim, 0),
         ("freq_cis_real", seq_len * hs // 2, 0), ("freq_cis_imag", seq_len * hs // 2, 0)]
    if vocab < 0:  # a negative vocab_size: a separate classifier follows
        t.append(("wcls", V * dim, dim))
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="llama2.c checkpoint")
    ap.add_argument("dst", help="the checkpoint to write, its matrices rounded through Q4_0")
    ap.add_argument("--skip-embd", action="store_true",
                    help="leave the token embedding and the classifier in float32")
    a = ap.parse_args()
    with open(a.src, "rb") as f:
        raw = f.read()
    if len(raw) < 28:
        sys.exit(f"q4_0_ref: {a.src}: {len(raw)} bytes, shorter than the 28-byte header")
    h = struct.unpack("<7i", raw[:28])
    if min(h[:5]) <= 0 or h[5] == 0 or h[6] <= 0 or h[0] % h[3]:
        sys.exit(f"q4_0_ref: {a.src}: header {h} is no llama2.c config")
    t = tensors(h)
    want = 28 + 4 * sum(n for _, n, _ in t)
    if len(raw) != want:
        sys.exit(f"q4_0_ref: {a.src}: the header implies {want} bytes but the file has {len(raw)}")
    w = array("f")
    w.frombytes(raw[28:])
    if sys.byteorder != "little":
        w.byteswap()
    off, rounded = 0, 0
    for name, n, cols in t:
        embd = name in ("token_embedding", "wcls")
        if cols and not (embd and a.skip_embd):
            round_matrix(w, off, n, cols)
            rounded += n
        off += n
    if sys.byteorder != "little":
        w.byteswap()
    with open(a.dst, "wb") as f:
        f.write(raw[:28])
        w.tofile(f)
    print(f"q4_0_ref: {a.dst}: {rounded} of {len(w)} floats rounded through Q4_0"
          + (" (embedding left float32)" if a.skip_embd else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
