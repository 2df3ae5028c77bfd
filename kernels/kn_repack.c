/* kernels: repacking of canonical matrices into the slices a tensor-parallel rank holds. */
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

void kn_repack_rows(const struct kn_mat *src, int r0, int r1, void *dst)
{
    KN_ASSERT(!kn_is_tiled(src->dtype)); /* device layouts are made from canonical slices */
    struct kn_mat s;
    kn_mat_rows(src, r0, r1, &s);
    uint8_t *codes, *scales, *zeros;
    int rows = r1 - r0;
    parts(src->dtype, rows, src->cols, src->group, dst, &codes, &scales, &zeros);
    memset(dst, 0, kn_mat_bytes(src->dtype, rows, src->cols, src->group));
    size_t ng = src->dtype >= KN_DT_W4A16 ? (size_t)kn_ngroups(src->cols, src->group) : 0;
    switch (src->dtype) {
    case KN_DT_F32:
    case KN_DT_BF16:
        memcpy(codes, s.codes, (size_t)rows * (size_t)src->cols * elem_bytes(src->dtype));
        return;
    case KN_DT_Q8:
        memcpy(codes, s.codes, (size_t)rows * (size_t)src->cols);
        memcpy(scales, s.scales, (size_t)rows * sizeof(float));
        return;
    case KN_DT_W4A16:
    case KN_DT_W4A8:
        memcpy(codes, s.codes, (size_t)rows * kn_w4_row_bytes(src->cols));
        memcpy(scales, s.scales, (size_t)rows * ng * 2);
        if (zeros)
            memcpy(zeros, s.zeros, (size_t)rows * ng);
        return;
    case KN_DT_W4A8_T: /* asserted above */
    case KN_DT_W4A16_T:
        return;
    }
}

static int nibble(const uint8_t *row, int i) { return i % 2 ? row[i / 2] >> 4 : row[i / 2] & 15; }

void kn_repack_cols(const struct kn_mat *src, int c0, int c1, int pad, void *dst)
{
    KN_ASSERT(!kn_is_tiled(src->dtype));
    KN_ASSERT(0 <= c0 && c0 <= c1 && c1 <= src->cols && pad >= 0);
    int rows = src->rows, cols = pad + c1 - c0, n = c1 - c0;
    uint8_t *codes, *scales, *zeros;
    parts(src->dtype, rows, cols, src->group, dst, &codes, &scales, &zeros);
    memset(dst, 0, kn_mat_bytes(src->dtype, rows, cols, src->group));
    if (src->dtype == KN_DT_F32 || src->dtype == KN_DT_BF16 || src->dtype == KN_DT_Q8) {
        KN_ASSERT(pad == 0);
        size_t eb = elem_bytes(src->dtype);
        for (int r = 0; r < rows; r++)
            memcpy(codes + (size_t)r * (size_t)cols * eb,
                   (const uint8_t *)src->codes + ((size_t)r * (size_t)src->cols + (size_t)c0) * eb,
                   (size_t)n * eb);
        if (src->dtype == KN_DT_Q8) /* per-row scales: partial sums of one row add up exactly */
            memcpy(scales, src->scales, (size_t)rows * sizeof(float));
        return;
    }
    int g = src->group;
    KN_ASSERT((c0 - pad) % g == 0);
    int g0 = (c0 - pad) / g, ng_src = kn_ngroups(src->cols, g), ng = kn_ngroups(cols, g);
    size_t rb_src = kn_w4_row_bytes(src->cols), rb = kn_w4_row_bytes(cols);
    const uint16_t *ssc = src->scales;
    uint16_t *dsc = (uint16_t *)scales;
    for (int r = 0; r < rows; r++) {
        const uint8_t *in = (const uint8_t *)src->codes + (size_t)r * rb_src;
        uint8_t *out = codes + (size_t)r * rb;
        for (int j = 0; j < n; j++) {
            int i = pad + j, v = nibble(in, c0 + j);
            out[i / 2] |= (uint8_t)(i % 2 ? v << 4 : v);
        }
        for (int k = 0; k < ng; k++) {
            dsc[(size_t)r * ng + k] = ssc[(size_t)r * ng_src + g0 + k];
            if (zeros)
                zeros[(size_t)r * ng + k] = src->zeros[(size_t)r * ng_src + g0 + k];
        }
    }
}

void kn_repack_tiles(const struct kn_mat *src, int b0, int b1, void *dst)
{
    KN_ASSERT((src->dtype == KN_DT_W4A8 || src->dtype == KN_DT_W4A16) && src->group % 8 == 0);
    enum kn_dtype dt = src->dtype == KN_DT_W4A8 ? KN_DT_W4A8_T : KN_DT_W4A16_T;
    int cols = src->cols, group = src->group, ng = kn_ngroups(cols, group);
    int nblk = (src->rows + KN_TILE_ROWS - 1) / KN_TILE_ROWS;
    KN_ASSERT(0 <= b0 && b0 <= b1 && b1 <= nblk);
    size_t bb = kn_tile_block_bytes(dt, cols, group), rb = kn_w4_row_bytes(cols);
    for (int b = b0; b < b1; b++) {
        uint8_t *blk = (uint8_t *)dst + (size_t)b * bb;
        uint16_t *sc = (uint16_t *)(blk + kn_tile_scales_offset(cols, group));
        uint8_t *zr = blk + kn_tile_zeros_offset(cols, group); /* W4A16_T only */
        memset(blk, 0, bb);
        for (int n = 0; n < KN_TILE_ROWS; n++) {
            int r = b * KN_TILE_ROWS + n;
            if (r >= src->rows)
                break; /* padding rows: zero codes and scales */
            const uint8_t *in = (const uint8_t *)src->codes + (size_t)r * rb;
            for (int k = 0; k < cols; k++) {
                int o = k / 8, j = k % 8; /* octets run on across groups: group % 8 == 0 */
                blk[(size_t)o * 64 + (size_t)n * 4 + (size_t)(j % 4)] |=
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
