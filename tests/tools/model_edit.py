#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A model file with one setting changed, for the refusal tests (Python 3 standard library only).

  model_edit.py gguf IN.gguf OUT.gguf KEY TYPE VALUE   KEY set to VALUE of TYPE (str, u32, f32, bool),
                                                       replaced or added; the tensor data moved
                                                       to the next aligned offset after the new
                                                       header, its bytes unchanged
  model_edit.py gguf-arch IN.gguf OUT.gguf ARCH      general.architecture set to ARCH and every
                                                       key of the old one's prefix renamed
  model_edit.py gguf-fill IN.gguf OUT.gguf SUFFIX VALUE
                                                       every F32 tensor whose name ends in SUFFIX
                                                       filled with VALUE (a feature switched off:
                                                       zero biases, sinks of -1e4)
  model_edit.py config IN.json OUT.json JSON           the fields of the JSON object merged into
                                                       config.json (a null value drops one)
"""
import json
import struct
import sys

# GGUF value types: byte sizes of the scalars; 8 is a string, 9 an array
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_str(b, o):
    n, = struct.unpack_from('<Q', b, o)
    return o + 8 + n


def skip_val(b, t, o):
    if t == 8:
        return skip_str(b, o)
    if t == 9:
        et, n = struct.unpack_from('<IQ', b, o)
        o += 12
        for _ in range(n):
            o = skip_val(b, et, o)
        return o
    return o + SIZES[t]


def gguf_set(src, dst, key, ty, val, rename=None):
    b = open(src, 'rb').read()
    if b[:4] != b'GGUF':
        sys.exit(f'{src}: not a GGUF file')
    _, n_tensors, n_kv = struct.unpack_from('<IQQ', b, 4)
    off, kvs, align, old = 24, [], 32, None
    for _ in range(n_kv):
        start = off
        off = skip_str(b, off)
        k = b[start + 8:off].decode()
        t, = struct.unpack_from('<I', b, off)
        end = skip_val(b, t, off + 4)
        if k == 'general.alignment':
            align, = struct.unpack_from('<I', b, off + 4)
        if k == 'general.architecture':
            old = b[off + 4 + 8:end].decode()
        if rename is not None and old and k.startswith(old + '.'):
            nk = (rename + k[len(old):]).encode()
            kvs.append(struct.pack('<Q', len(nk)) + nk + b[off:end])
        elif k != key:
            kvs.append(b[start:end])
        off = end
    infos = off
    for _ in range(n_tensors):  # name, n_dims, dims, type, offset
        off = skip_str(b, off)
        nd, = struct.unpack_from('<I', b, off)
        off += 4 + 8 * nd + 4 + 8
    data = (off + align - 1) // align * align
    kb = struct.pack('<Q', len(key.encode())) + key.encode()
    if ty == 'str':
        v = val.encode()
        kvs.append(kb + struct.pack('<IQ', 8, len(v)) + v)
    elif ty == 'u32':
        kvs.append(kb + struct.pack('<II', 4, int(val)))
    elif ty == 'f32':
        kvs.append(kb + struct.pack('<If', 6, float(val)))
    elif ty == 'bool':
        kvs.append(kb + struct.pack('<IB', 7, val == 'true'))
    else:
        sys.exit(f'type {ty}: expected str, u32, f32 or bool')
    head = b[:8] + struct.pack('<QQ', n_tensors, len(kvs)) + b''.join(kvs) + b[infos:off]
    head += b'\0' * (-len(head) % align)
    open(dst, 'wb').write(head + b[data:])


def gguf_fill(src, dst, suffix, val):
    b = bytearray(open(src, 'rb').read())
    if b[:4] != b'GGUF':
        sys.exit(f'{src}: not a GGUF file')
    _, n_tensors, n_kv = struct.unpack_from('<IQQ', b, 4)
    off, align = 24, 32
    for _ in range(n_kv):
        start = off
        off = skip_str(b, off)
        k = bytes(b[start + 8:off]).decode()
        t, = struct.unpack_from('<I', b, off)
        if k == 'general.alignment':
            align, = struct.unpack_from('<I', b, off + 4)
        off = skip_val(b, t, off + 4)
    hits = []
    for _ in range(n_tensors):
        start = off
        off = skip_str(b, off)
        name = bytes(b[start + 8:off]).decode()
        nd, = struct.unpack_from('<I', b, off)
        dims = struct.unpack_from(f'<{nd}Q', b, off + 4)
        ty, toff = struct.unpack_from('<IQ', b, off + 4 + 8 * nd)
        off += 4 + 8 * nd + 4 + 8
        n = 1
        for d in dims:
            n *= d
        if name.endswith(suffix):
            if ty != 0:
                sys.exit(f'{name}: ggml type {ty}, expected F32 (0)')
            hits.append((toff, n))
    if not hits:
        sys.exit(f'{src}: no tensor ends in {suffix}')
    data = (off + align - 1) // align * align
    for toff, n in hits:
        struct.pack_into(f'<{n}f', b, data + toff, *([float(val)] * n))
    open(dst, 'wb').write(b)


def config_set(src, dst, fields):
    c = json.load(open(src))
    for k, v in json.loads(fields).items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    json.dump(c, open(dst, 'w'), indent=2)


if __name__ == '__main__':
    if len(sys.argv) == 7 and sys.argv[1] == 'gguf':
        gguf_set(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == 'gguf-arch':
        gguf_set(sys.argv[2], sys.argv[3], 'general.architecture', 'str', sys.argv[4],
                 rename=sys.argv[4])
    elif len(sys.argv) == 6 and sys.argv[1] == 'gguf-fill':
        gguf_fill(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == 'config':
        config_set(*sys.argv[2:])
    else:
        sys.exit(__doc__)
