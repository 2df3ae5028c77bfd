/* SPDX-License-Identifier: MIT */
/* kernels/kn_repack.c: repacking of canonical matrices into the slices a tensor-parallel rank
 * holds. */
#include "kn.h"

#include <string.h>

static size_t elem_bytes(enum kn_dtype dt) { return dt == KN_DT_F32 ? 4 : dt == KN_DT_BF16 ? 2 : 1; }

void kn_mat_rows(const struct kn_mat *m, int r0, int r1, struct kn_mat *out)
{
    KN_ASSERT(0 <= r0 && r0 <= r1 && r1 <= m->rows);
    *out = *m;
    out->rows = r1 - r0;
    size_t r = (size_t)r0;
    switch (m->dtype) {
    case KN_DT_W4A8_T: /* whole blocks only */
    case KN_DT_W4A16_T:
        KN_ASSERT(r0 % KN_TILE_ROWS == 0);
        out->codes = (const uint8_t *)m->codes +
                     r / KN_TILE_ROWS * kn_tile_block_bytes(m->dtype, m->cols, m->group);
        return;
    case KN_DT_F32:
    case KN_DT_BF16:
    case KN_DT_Q8:
        out->codes = (const uint8_t *)m->codes + r * (size_t)m->cols * elem_bytes(m->dtype);
        if (m->dtype == KN_DT_Q8)
            out->scales = (const float *)m->scales + r;
        return;
    case KN_DT_Q6: {
        size_t spr = (size_t)kn_q6_blocks(m->cols) * (KN_Q6_BLOCK / KN_Q6_GROUP);
        out->codes = (const uint8_t *)m->codes + r * kn_row_bytes(m->dtype, m->cols);
        out->scales = (const uint16_t *)m->scales + r * spr;
        return;
    }
    case KN_DT_W4A16:
    case KN_DT_W4A8: {
        size_t ng = (size_t)kn_ngroups(m->cols, m->group);
        out->codes = (const uint8_t *)m->codes + r * kn_w4_row_bytes(m->cols);
        out->scales = (const uint16_t *)m->scales + r * ng;
        if (m->zeros)
            out->zeros = m->zeros + r * ng;
        return;
    }
    }
}

/* Pointers to the parts of a canonical buffer being written. */
static void parts(enum kn_dtype dt, int rows, int cols, int group, void *base, uint8_t **codes,
                  uint8_t **scales, uint8_t **zeros)
{
    struct kn_mat v;
    kn_mat_view(&v, dt, rows, cols, group, base);
    *codes = (uint8_t *)v.codes;
    *scales = (uint8_t *)v.scales;
    *zeros = (uint8_t *)v.zeros;
}

static int nibble(const uint8_t *row, int i) { return i % 2 ? row[i / 2] >> 4 : row[i / 2] & 15; }

/* Elements [c0, c0 + n) of the int4 row @in behind @pad zero elements into @out, whose
 * kn_w4_row_bytes(pad + n) bytes are all written. */
static void w4_row_cols(const uint8_t *in, int c0, int n, int pad, uint8_t *out)
{
    size_t rb = kn_w4_row_bytes(pad + n);
    if (c0 % 2 == 0 && pad % 2 == 0) { /* whole bytes: a copy, the odd tail's high nibble cleared */
        memset(out, 0, (size_t)pad / 2);
        memcpy(out + pad / 2, in + c0 / 2, (size_t)n / 2);
        if (n % 2)
            out[rb - 1] = in[(c0 + n) / 2] & 15;
        return;
    }
    memset(out, 0, rb);
    for (int j = 0; j < n; j++) {
        int i = pad + j, v = nibble(in, c0 + j);
        out[i / 2] |= (uint8_t)(i % 2 ? v << 4 : v);
    }
}

void kn_repack_slice(const struct kn_mat *src, int r0, int r1, int c0, int c1, int pad, void *dst,
                     int dst_rows, int d0)
{
    KN_ASSERT(!kn_is_tiled(src->dtype)); /* device layouts are made from canonical slices */
    KN_ASSERT(0 <= r0 && r0 <= r1 && r1 <= src->rows && 0 <= d0 && d0 + r1 - r0 <= dst_rows);
    KN_ASSERT(0 <= c0 && c0 <= c1 && c1 <= src->cols && pad >= 0);
    int cols = pad + c1 - c0, n = c1 - c0;
    uint8_t *codes, *scales, *zeros;
    parts(src->dtype, dst_rows, cols, src->group, dst, &codes, &scales, &zeros);
    if (src->dtype == KN_DT_F32 || src->dtype == KN_DT_BF16 || src->dtype == KN_DT_Q8) {
        KN_ASSERT(pad == 0);
        size_t eb = elem_bytes(src->dtype);
        for (int r = r0; r < r1; r++)
            memcpy(codes + (size_t)(d0 + r - r0) * (size_t)cols * eb,
                   (const uint8_t *)src->codes + ((size_t)r * (size_t)src->cols + (size_t)c0) * eb,
                   (size_t)n * eb);
        if (src->dtype == KN_DT_Q8) /* per-row scales: partial sums of one row add up exactly */
            memcpy((float *)scales + d0, (const float *)src->scales + r0,
                   (size_t)(r1 - r0) * sizeof(float));
        return;
    }
    if (src->dtype == KN_DT_Q6) { /* whole rows only: the head splits by rows */
        KN_ASSERT(pad == 0 && c0 == 0 && c1 == src->cols);
        size_t rb = kn_row_bytes(KN_DT_Q6, cols), spr = (size_t)kn_q6_blocks(cols) * 8 * 2;
        memcpy(codes + (size_t)d0 * rb, (const uint8_t *)src->codes + (size_t)r0 * rb,
               (size_t)(r1 - r0) * rb);
        memcpy(scales + (size_t)d0 * spr, (const uint8_t *)src->scales + (size_t)r0 * spr,
               (size_t)(r1 - r0) * spr);
        return;
    }
    int g = src->group;
    KN_ASSERT((c0 - pad) % g == 0); /* the slice's groups are the source's */
    int g0 = (c0 - pad) / g, ng_src = kn_ngroups(src->cols, g), ng = kn_ngroups(cols, g);
    size_t rb_src = kn_w4_row_bytes(src->cols), rb = kn_w4_row_bytes(cols);
    for (int r = r0; r < r1; r++) {
        size_t d = (size_t)(d0 + r - r0);
        w4_row_cols((const uint8_t *)src->codes + (size_t)r * rb_src, c0, n, pad, codes + d * rb);
        memcpy((uint16_t *)scales + d * (size_t)ng,
               (const uint16_t *)src->scales + (size_t)r * (size_t)ng_src + g0, (size_t)ng * 2);
        if (zeros)
            memcpy(zeros + d * (size_t)ng, src->zeros + (size_t)r * (size_t)ng_src + g0,
                   (size_t)ng);
    }
}

void kn_repack_rows(const struct kn_mat *src, int r0, int r1, void *dst)
{
    memset(dst, 0, kn_mat_bytes(src->dtype, r1 - r0, src->cols, src->group));
    kn_repack_slice(src, r0, r1, 0, src->cols, 0, dst, r1 - r0, 0);
}

void kn_repack_cols(const struct kn_mat *src, int c0, int c1, int pad, void *dst)
{
    memset(dst, 0, kn_mat_bytes(src->dtype, src->rows, pad + c1 - c0, src->group));
    kn_repack_slice(src, 0, src->rows, c0, c1, pad, dst, src->rows, 0);
}

/* Two octets of a canonical row (elements e0..e7 in nibbles 0..7 of each 32-bit half) in tile
 * order: nibbles e0 e4 e1 e5 e2 e6 e3 e7, so byte j holds e_j low and e_(j+4) high. A perfect
 * shuffle of the nibbles: swap the middle bytes, then the middle nibbles of each 16 bits. */
static uint64_t octet_shuffle(uint64_t x)
{
    uint64_t t = ((x >> 8) ^ x) & 0x0000ff000000ff00ull;
    x ^= t ^ (t << 8);
    t = ((x >> 4) ^ x) & 0x00f000f000f000f0ull;
    return x ^ t ^ (t << 4);
}

void kn_repack_tiles(const struct kn_mat *src, int b0, int b1, void *dst)
{
    KN_ASSERT((src->dtype == KN_DT_W4A8 || src->dtype == KN_DT_W4A16) && src->group % 8 == 0);
    enum kn_dtype dt = src->dtype == KN_DT_W4A8 ? KN_DT_W4A8_T : KN_DT_W4A16_T;
    int cols = src->cols, group = src->group, ng = kn_ngroups(cols, group);
    int nblk = (src->rows + KN_TILE_ROWS - 1) / KN_TILE_ROWS, whole = cols / 8;
    KN_ASSERT(0 <= b0 && b0 <= b1 && b1 <= nblk);
    size_t bb = kn_tile_block_bytes(dt, cols, group), rb = kn_w4_row_bytes(cols);
    for (int b = b0; b < b1; b++) {
        uint8_t *blk = (uint8_t *)dst + (size_t)b * bb;
        uint16_t *sc = (uint16_t *)(blk + kn_tile_scales_offset(cols, group));
        uint8_t *zr = blk + kn_tile_zeros_offset(cols, group); /* W4A16_T only */
        memset(blk, 0, bb); /* padding rows, octets past cols, their scales: zero */
        for (int n = 0; n < KN_TILE_ROWS; n++) {
            int r = b * KN_TILE_ROWS + n;
            if (r >= src->rows)
                break;
            const uint8_t *in = (const uint8_t *)src->codes + (size_t)r * rb;
            uint8_t *out = blk + (size_t)n * 4; /* octet o of this row at out + 64 o */
            int o = 0;
            for (; o + 2 <= whole; o += 2) {
                uint64_t w;
                memcpy(&w, in + (size_t)o * 4, 8);
                w = octet_shuffle(w);
                memcpy(out + (size_t)o * 64, &w, 4);
                memcpy(out + (size_t)o * 64 + 64, (const uint8_t *)&w + 4, 4);
            }
            for (int k = o * 8; k < cols; k++) { /* an odd last whole octet, a ragged one */
                int j = k % 8;
                out[(size_t)(k / 8) * 64 + (size_t)(j % 4)] |=
                    (uint8_t)(nibble(in, k) << (j < 4 ? 0 : 4));
            }
            for (int g = 0; g < ng; g++) {
                size_t i = (size_t)g * KN_TILE_ROWS + (size_t)n;
                size_t s = (size_t)r * (size_t)ng + (size_t)g;
                sc[i] = ((const uint16_t *)src->scales)[s];
                if (dt == KN_DT_W4A16_T)
                    zr[i] = src->zeros[s];
            }
        }
    }
}
