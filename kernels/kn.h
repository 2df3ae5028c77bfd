/* SPDX-License-Identifier: MIT */
/* kernels/kn.h: pure compute over packed weights, one function table per ISA.
 *
 * Weight formats (the canonical .shlm layout, see shm/shlm.h):
 *   KN_DT_F32    rows x cols float, row-major.
 *   KN_DT_BF16   rows x cols bfloat16, row-major.
 * Codes come first, their region padded to a multiple of 64 bytes (kn_codes_bytes), then scales.
 *   KN_DT_Q8     int8 per row: codes (rows x cols int8), then scales (rows float).
 *                value = scale[r] * code. Activations are quantized to int16 per token (q16,
 *                |error| <= max|x| / 65534): the integer sum is exact, so every table gives the
 *                reference's result bit for bit, and a row's result is the same whatever
 *                other rows or tokens share its product.
 *   KN_DT_W4A16  asymmetric int4 per group: codes (rows x ceil(cols/2) bytes, element 2j in the
 *                low nibble of byte j, 2j+1 in the high one), then scales (rows x ngroups fp16),
 *                then zero points (rows x ngroups uint8, 0..15). value = scale * (code - zero).
 *   KN_DT_W4A8   symmetric int4 per group, zero point 8: codes as W4A16, then scales
 *                (rows x ngroups fp16, of either sign: the sign picks the side of the group that
 *                gets code 0, the 8th level). value = scale * (code - 8). Activations are
 *                quantized to int8 per token.
 *   KN_DT_Q6     6-bit codes per group of KN_Q6_GROUP (32) elements (the embedding / LM head of
 *                --head-bits 6): a row is ceil(cols / 256) blocks of KN_Q6_BLOCK (256) elements,
 *                the last one padded with code 32 (value 0), 192 bytes each; after all rows' codes
 *                the scales (rows x blocks x 8 fp16, of either sign as W4A8's). value = scale *
 *                (code - 32), code 0..63. In a block, element e = 32 (L % 8) + 16 (L / 8) + 4v + j
 *                (lane L < 16, vector v < 4, j < 4) is byte b = 4L + j of vector v: its low four
 *                bits in the low nibble of byte b of the block's bytes [0, 64) for v = 0, the high
 *                nibble there for v = 1, the same in bytes [64, 128) for v = 2 and 3; its two high
 *                bits at bit 2v of byte 128 + b. So one 64-byte vector of codes is 16 lanes x 4
 *                elements, lane L a half of group L % 8, and VPDPBUSD against the activations in
 *                the same order (KN_ACT_Q6: int8 per group of 32) sums every lane in place.
 * Groups run along a row; the last group of a row is shorter when the group does not divide cols.
 *
 * Device layouts, made from the canonical one by kn_repack_tiles() when a weights segment is
 * built (never stored in a .shlm file):
 *   KN_DT_W4A8_T W4A8 in VNNI tiles. Rows go in blocks of 16 (the last one padded with zero
 *                rows), each block kn_tile_block_bytes() long: for every group g, group/8 octets
 *                of 64 bytes, then the block's scales. In octet o of group g, the four bytes at
 *                4n hold row n of the block: byte j has element k = g*group + 8o + j in its low
 *                nibble and k + 4 in its high one (zero past cols). After all groups, fp16 scales
 *                [ngroups][16] (scale of row n, group g at 16g + n), padded to 64 bytes. One
 *                64-byte load is 16 rows x 8 elements: VPDPBUSD against four broadcast
 *                activation bytes gives 16 output lanes at once, no horizontal sums.
 *   KN_DT_W4A16_T W4A16 in the same tiles, and after the scales the zero points, uint8
 *                [ngroups][16], padded to 64 bytes: 16 rows' codes widen to 16 float lanes
 *                that meet one broadcast activation per FMA.
 */
#ifndef SHARDLM_KN_H
#define SHARDLM_KN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KN_ASSERT(c)                                                                               \
    do {                                                                                           \
        if (!(c))                                                                                  \
            kn_assert_fail(#c, __FILE__, __LINE__);                                                \
    } while (0)
_Noreturn void kn_assert_fail(const char *what, const char *file, int line);

enum kn_dtype {
    KN_DT_F32 = 0,
    KN_DT_BF16 = 1,
    KN_DT_Q8 = 2,
    KN_DT_W4A16 = 3,
    KN_DT_W4A8 = 4,
    KN_DT_W4A8_T = 5, /* device layouts, see above */
    KN_DT_W4A16_T = 6,
    KN_DT_Q6 = 7,
};
#define KN_DT_COUNT 8

/* KN_DT_Q6's elements per scale and per row block (codes and scales pad rows to whole blocks). */
#define KN_Q6_GROUP 32
#define KN_Q6_BLOCK 256
static inline int kn_q6_blocks(int cols) { return (cols + KN_Q6_BLOCK - 1) / KN_Q6_BLOCK; }

/* Queries per attention call (one per SIMD lane), and the largest head the kernels take. */
#define KN_ATT_TILE 16
#define KN_MAX_HEAD_DIM 1024

/* Tokens per KV cache block (shm/seg.h pages the cache in these): a multiple of the attention
 * kernels' key blocks (16 AVX-512, 8 AVX2). */
#define KN_KV_BLOCK 16

/* One KV head's cache as attention reads it, in blocks of KN_KV_BLOCK positions: the key of
 * position t is the head's row at k + blocks[t / KN_KV_BLOCK] * block_stride +
 * (t % KN_KV_BLOCK) * row_stride (floats), its value the same offset from v. */
struct kn_kv {
    const float *k, *v;
    const uint32_t *blocks;
    size_t block_stride, row_stride;
};

/* Attention's options; all zero (or a NULL pointer) is plain causal attention scaled by
 * 1 / sqrt(hd), bit for bit as before the options existed. */
struct kn_att {
    float scale;   /* score = scale * q.k; 0: 1 / sqrt(hd) (Gemma 2: query_pre_attn_scalar^-0.5) */
    float softcap; /* 0: none; else score = softcap * tanh(score / softcap) (Gemma 2) */
    int window;    /* 0: none; else the query at position p reads keys t with p - t < window
                    * (sliding-window layers: Gemma 2/3, Mistral) */
    const float *sinks; /* (nh) NULL: none; else sinks[j] is the sink logit of query head j of
                         * the call (j < nh, the tile's heads): a term of the softmax's
                         * denominator with no value row (gpt-oss; ggml's soft_max_ext with
                         * sinks). With scores s_t (scaled, soft-capped, in the window) and
                         * M = max(max_t s_t, sink), out = sum_t e^(s_t - M) v_t /
                         * (sum_t e^(s_t - M) + e^(sink - M)). */
};

/* (A table entry UINT32_MAX is a block given back, before every layer's window: reading it is a
 * broken invariant, never a wild read.) */
static inline size_t kn_kv_off(const struct kn_kv *c, int t)
{
    KN_ASSERT(c->blocks[t / KN_KV_BLOCK] != UINT32_MAX);
    return (size_t)c->blocks[t / KN_KV_BLOCK] * c->block_stride +
           (size_t)(t % KN_KV_BLOCK) * c->row_stride;
}

/* Rows per tile block of KN_DT_W4A8_T. */
#define KN_TILE_ROWS 16

enum kn_isa { KN_ISA_REF = 0, KN_ISA_AVX2 = 1, KN_ISA_AVX512 = 2, KN_ISA_AMX = 3 };

/* Activation quantization granularity for W4A8 and the padding of every prepared activation. */
#define KN_MAX_GROUP 256

/* A read-only view of one weight matrix (rows = outputs, cols = inputs). */
struct kn_mat {
    enum kn_dtype dtype;
    int rows, cols;
    int group;             /* elements per group (W4 only), even, 32..KN_MAX_GROUP */
    const void *codes;     /* F32/BF16 data, or Q8/W4 codes */
    const void *scales;    /* Q8: float [rows]; W4: uint16 fp16 [rows][ngroups] */
    const uint8_t *zeros;  /* W4A16: [rows][ngroups] */
};

static inline int kn_ngroups(int cols, int group) { return (cols + group - 1) / group; }
static inline size_t kn_w4_row_bytes(int cols) { return (size_t)(cols + 1) / 2; }
static inline bool kn_is_tiled(enum kn_dtype dt)
{
    return dt == KN_DT_W4A8_T || dt == KN_DT_W4A16_T;
}
static inline bool kn_is_w4(enum kn_dtype dt)
{
    return dt == KN_DT_W4A16 || dt == KN_DT_W4A8 || kn_is_tiled(dt);
}
/* Tiled layouts: the offset of the scales in a block of 16 rows, and the block's bytes. */
static inline size_t kn_tile_scales_offset(int cols, int group)
{
    return (size_t)kn_ngroups(cols, group) * (size_t)group * 8;
}
/* KN_DT_W4A16_T: the zero points follow the scales */
static inline size_t kn_tile_zeros_offset(int cols, int group)
{
    return kn_tile_scales_offset(cols, group) +
           ((size_t)kn_ngroups(cols, group) * 32 + 63) / 64 * 64;
}
static inline size_t kn_tile_block_bytes(enum kn_dtype dt, int cols, int group)
{
    size_t zeros = dt == KN_DT_W4A16_T ? ((size_t)kn_ngroups(cols, group) * 16 + 63) / 64 * 64 : 0;
    return kn_tile_zeros_offset(cols, group) + zeros;
}

/* A parallel for that the caller hands in (kernels/ starts no threads of its own): @run calls
 * fn(arg, i, n) once for every member i < n of @pool, the calling thread among them, and returns
 * when all have finished. worker/pool.h's wrk_pool_par() makes one of the worker's pool. */
struct kn_par {
    void (*run)(void *pool, void (*fn)(void *arg, int i, int n), void *arg);
    void *pool;
};

/* What the code knows about one weight format (kernels/kn_types.c), as ggml's type_traits[]:
 * one lookup instead of a switch on the dtype in every file. Block shape: (tile_rows, or 1 row
 * when 0) x (the tensor's group when grouped, else 1 element); a row-major row's codes are
 * kn_row_bytes() long. The per-ISA entries of a format are in each ISA's table:
 * kn_ops.mm[dtype] (its matrix product) and kn_ops.act_prepare (the activations it reads). */
struct kn_type_traits {
    const char *name;    /* as `shardlm inspect` prints it */
    int bits;            /* of one element's code: 32, 16, 8 or 4 */
    int scale_bytes;     /* of one scale: a float per row (q8), an fp16 per group (w4); 0: none */
    bool grouped;        /* scales (and zero points) per group of a row, not per row */
    bool zeros;          /* a uint8 zero point per group after the scales (asymmetric) */
    int tile_rows;       /* device layouts: rows per block (KN_TILE_ROWS); 0: row-major */
    int row_block;       /* rows padded to whole blocks of this many elements (q6); 0: none */
    int block_scales;    /* row_block: scales per block (q6: one per KN_Q6_GROUP elements) */
    enum kn_dtype canon; /* the file layout it is made from (itself for a file layout) */
    unsigned act_parts;  /* the parts of a kn_act its products read (KN_ACT_*) */
    /* Row @r of @m dequantized into @out (m->cols floats). */
    void (*to_float)(const struct kn_mat *m, int r, float *out);
    /* The canonical matrix (kn_mat_bytes() at @out) of the f32 rows @w (rows, cols), its rows
     * split over @par's members where that pays (NULL: the caller's thread; the result does not
     * depend on it); NULL for the device layouts, which kn_repack_tiles() makes. */
    void (*from_float)(const float *w, int rows, int cols, int group, void *out,
                       const struct kn_par *par);
};
extern const struct kn_type_traits kn_type_traits[KN_DT_COUNT];

/* Bytes of one row's codes in a row-major layout (not for a tiled one: its rows interleave). */
size_t kn_row_bytes(enum kn_dtype dt, int cols);
/* Bytes of the (padded) codes region, and of the whole matrix in the canonical layout. */
size_t kn_codes_bytes(enum kn_dtype dt, int rows, int cols);
size_t kn_mat_bytes(enum kn_dtype dt, int rows, int cols, int group);
/* Fills the part pointers of @m from one contiguous canonical buffer @base. */
void kn_mat_view(struct kn_mat *m, enum kn_dtype dt, int rows, int cols, int group,
                 const void *base);
/* Rows [r0, r1) of the canonical matrix (rows, cols) of a row-major @dt, read apart: @codes
 * holds their code rows (row r0 first), @tail the matrix's scales and zero points (what
 * follows its codes region). For a loader that reads a matrix a chunk of rows at a time. */
void kn_mat_view_rows(struct kn_mat *m, enum kn_dtype dt, int rows, int cols, int group, int r0,
                      int r1, const void *codes, const void *tail);

/* Rows [r0, r1) of @m as a view of the same memory. */
void kn_mat_rows(const struct kn_mat *m, int r0, int r1, struct kn_mat *out);
/* Repacking for shards (kn_repack.c), canonical layout in and out.
 * The general form, for a loader that sees a matrix a chunk of rows at a time: rows [r0, r1) of
 * @src, their columns [c0, c1) behind @pad zero columns, become rows [d0, d0 + r1 - r0) of the
 * canonical matrix at @dst of @dst_rows rows and pad + c1 - c0 columns (same dtype and group).
 * Only those rows are written (all their bytes); the rest of @dst is left alone. Column rules
 * as for kn_repack_cols. */
void kn_repack_slice(const struct kn_mat *src, int r0, int r1, int c0, int c1, int pad, void *dst,
                     int dst_rows, int d0);
/* rows [r0, r1) of @src into @dst, which has kn_mat_bytes() of the slice; */
void kn_repack_rows(const struct kn_mat *src, int r0, int r1, void *dst);
/* columns [c0, c1) of every row with @pad zero columns in front, into @dst of
 * kn_mat_bytes(rows, pad + c1 - c0). For W4 formats c0 - pad must be a multiple of the group, so
 * the slice's groups are the source's (the first and last may be partial: same scales). */
void kn_repack_cols(const struct kn_mat *src, int c0, int c1, int pad, void *dst);
/* The device layout of a W4 matrix: blocks [b0, b1) of 16 rows of the KN_DT_W4A8_T (from
 * W4A8) or KN_DT_W4A16_T (from W4A16) image at @dst (kn_mat_bytes() of the whole matrix) from
 * the canonical @src, whose row 0 is the image's row 0. Block by block, so a loader can stream
 * it. */
void kn_repack_tiles(const struct kn_mat *src, int b0, int b1, void *dst);
/* Element access in any W4 layout: the code (0..15) of row @r, column @k, and the fp16 scale of
 * row @r, group @g. For references and tests, not for speed. */
int kn_w4_code(const struct kn_mat *m, int r, int k);
uint16_t kn_w4_scale(const struct kn_mat *m, int r, int g);
/* The zero point of row @r, group @g: 8 for the W4A8 layouts. */
int kn_w4_zero(const struct kn_mat *m, int r, int g);

/* The parts of a kn_act, by the weight formats that read them (kn_type_traits[].act_parts):
 * act_prepare fills those in kn_act.parts, so that a prefill chunk writes only what its products
 * read (a W4A8 product reads 1 byte of the 12 an element has in all). */
enum {
    KN_ACT_F32 = 1 << 0, /* x and gsum */
    KN_ACT_EO = 1 << 1,  /* xe and xo */
    KN_ACT_Q = 1 << 2,   /* q, qgsum and qscale */
    KN_ACT_QEO = 1 << 3, /* qe, qo, qgsum and qscale */
    KN_ACT_Q16 = 1 << 4, /* q16 and q16scale */
    KN_ACT_Q6 = 1 << 5,  /* q6, q6scale and q6sum */
    KN_ACT_ALL = (1 << 6) - 1,
};

/* One activation vector prepared for the weight formats of kn_act.parts: x padded with zeros to a
 * multiple of @group, split into even/odd elements (to match the nibble order), per-group sums,
 * and the int8 per-token quantization used by W4A8. Buffers are owned by the caller
 * (kn_act_alloc). */
struct kn_act {
    int k, kpad, group;
    unsigned parts; /* KN_ACT_*: what act_prepare fills (kn_act_alloc: all) */
    float *x;       /* (kpad) */
    float *xe, *xo; /* (kpad/2) elements 0,2,4.. and 1,3,5.. */
    float *gsum;    /* (kpad/group) sum of x per group */
    int8_t *q;      /* (kpad) round(x / qscale) */
    int8_t *qe, *qo;/* (kpad/2) */
    int32_t *qgsum; /* (kpad/group) sum of q per group */
    float qscale;   /* max|x| / 127 */
    int16_t *q16;   /* (kpad) round(x / q16scale): the Q8 products' activations */
    float q16scale; /* max|x| / 32767 */
    /* KN_DT_Q6's activations, kn_q6_blocks(k) blocks of KN_Q6_BLOCK: per group of 32 int8
     * (round(x / its scale), max|x| / 127 over the group), in KN_DT_Q6's element order within
     * each block (byte 4L + j of vector v, see kn.h's top), zero past k; and per block and lane
     * L < 16 the scale of L's group and 32 x the sum of L's 16 codes (the weights' zero point) */
    int8_t *q6;
    float *q6scale;
    int32_t *q6sum;
};
/* Allocates buffers for vectors of length @k with group @group. Returns 0 or -ENOMEM. */
int kn_act_alloc(struct kn_act *a, int k, int group);
void kn_act_free(struct kn_act *a);
/* Prepares @a from @x (length a->k): at least the parts a->parts names, the others left as they
 * were or filled (the scalar one fills all). Each table has its own (kn_ops.act_prepare: the
 * scalar one for ref, the AVX2 one for avx2, the AVX-512 one for avx512 and amx); every
 * implementation gives the same x, q, qe/qo, qgsum, qscale, q16 and q16scale bit for bit; gsum may
 * differ in float summation order. */
void kn_act_prepare_scalar(struct kn_act *a, const float *x);
void kn_act_prepare_avx2(struct kn_act *a, const float *x);   /* group % 8 == 0, else scalar */
void kn_act_prepare_avx512(struct kn_act *a, const float *x); /* group % 16 == 0, else scalar */
/* q16 and q16scale of @a from a->x (its kpad floats) and their max |x| @amax. */
void kn_act_prepare_q16(struct kn_act *a, float amax);
/* q6, q6scale and q6sum of @a from @x (a->k floats): one definition (kernels/kn_q6.c) for every
 * table, which call it where a->parts has KN_ACT_Q6. */
void kn_act_prepare_q6(struct kn_act *a, const float *x);
/* The Q8 products' sum of a row: columns per int32 lane sum before it is added into an int64
 * ((4096 / 8) x 127 x 32767 < 2^31 for AVX2's 8 lanes, half that for AVX-512's 16). */
#define KN_Q8_CHUNK 4096

/* The matrix product of one weight format, an entry of kn_ops.mm: rows [n0, n1) of @w times
 * the @m prepared activations @x, into y (m, ldy) row-major. Shapes checked by the caller. */
typedef void kn_mm_fn(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,
                      int n0, int n1);
/* The checks every table's gemv and gemm make before its mm[] entry: rows in range, the
 * activations of @w's width (and group), prepared with the parts its format reads. A broken
 * invariant aborts. */
void kn_mm_check(const struct kn_mat *w, const struct kn_act *x, int m, int n0, int n1);

/* Scratch memory of one thread's GEMM calls, owned by the caller: @bytes at @buf, 64-byte
 * aligned. Sized once (kn_gemm_scratch_bytes over every matrix and the largest M a caller runs):
 * the kernels allocate nothing in the hot path. */
struct kn_scratch {
    void *buf;
    size_t bytes;
};

/* The dispatch table. Matrix products compute output rows [n0, n1) so callers can split work.
 * gemm: M activations, y is (M, ldy) row-major. */
struct kn_ops {
    const char *name;
    enum kn_isa isa;
    /* The per-ISA entries of the type traits: each weight format's matrix product, and the
     * preparation of the activations they read (the table's own ISA, none faster). */
    kn_mm_fn *mm[KN_DT_COUNT];
    void (*act_prepare)(struct kn_act *a, const float *x);
    /* y[n] = sum_k W[n,k] x[k] for n in [n0, n1): kn_mm_check, then mm[w->dtype] */
    void (*gemv)(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
    /* @scratch: the calling thread's, at least kn_gemm_scratch_bytes(this table, w, m) bytes
     * (NULL when that is 0); a smaller one is a broken invariant (KN_ASSERT). */
    void (*gemm)(const struct kn_mat *w, const struct kn_act *x, int m, float *y, int ldy, int n0,
                 int n1, const struct kn_scratch *scratch);
    /* The scratch bytes gemm needs over @w for @m activations; NULL: none, ever. */
    size_t (*gemm_scratch)(const struct kn_mat *w, int m);
    /* o = x * w / sqrt(mean(x^2) + eps) */
    void (*rmsnorm)(float *o, const float *x, const float *w, int n, float eps);
    /* Rotates @nheads heads of @head_dim at position @pos by pos * inv_freq[i] (head_dim / 2
     * frequencies, kn_rope_freqs), cos and sin times @mscale (kn_rope_freqs' magnitude; 1:
     * a plain rotation, bit for bit); interleaved pairs (llama2.c, GGUF llama) or NeoX halves. */
    void (*rope)(float *v, int nheads, int head_dim, int pos, const float *inv_freq, float mscale,
                 bool neox);
    /* In-place softmax over n values. */
    void (*softmax)(float *x, int n);
    /* a[i] = silu(a[i]) * b[i] */
    void (*silu_mul)(float *a, const float *b, int n);
    /* a[i] = gelu_tanh(a[i]) * b[i] */
    void (*gelu_mul)(float *a, const float *b, int n);
    /* gpt-oss's clamped SwiGLU: g = min(a[i], 7), u = clamp(b[i], -7, 7),
     * a[i] = g * sigmoid(1.702 g) * (u + 1) (AVX2: the reference's) */
    void (*swiglu_oai_mul)(float *a, const float *b, int n);
    /* x[i] = cap * tanh(x[i] / cap), cap > 0: the final logits' soft-cap (Gemma 2; attention's
     * is struct kn_att's) */
    void (*softcap)(float *x, int n, float cap);
    /* Causal attention of a tile of queries that share one KV head: tokens i < nt at positions
     * pos0 + i times query heads j < nh, nt * nh <= KN_ATT_TILE. Query (i, j) is the @hd floats
     * at q + i * q_stride + j * hd, its output goes to out + i * out_stride + j * hd; it reads
     * the key and value rows t = 0 .. pos0 + i of @kv (with @opt's window, only those with
     * pos0 + i - t < window: rows and cache blocks before are never read). Scores are scaled by
     * @opt's scale, then soft-capped if it says so; @opt's sinks join the softmax's
     * denominator (struct kn_att; NULL: all defaults).
     * @scratch holds pos0 + nt floats (the reference's scores; SIMD tables run an online softmax
     * over blocks of keys and do not touch it). hd <= KN_MAX_HEAD_DIM. */
    void (*attention)(float *out, size_t out_stride, const float *q, size_t q_stride, int nt,
                      int nh, int pos0, const struct kn_kv *kv, int hd, float *scratch,
                      const struct kn_att *opt);
    /* The calibration's Hessians (coordinator/convert/calib.c), one 8 x 16 tile of the Gram
     * matrix of the @n rows of @x (@ld floats apart): h[(i0 + a) * cols + k0 + b] +=
     * sum_r x[r][i0 + a] * x[r][k0 + b] for a < 8, b < 16 (kernels/arch/kn_gram.h). */
    void (*gram_tile)(float *h, int cols, const float *x, int n, int ld, int i0, int k0);
};

extern const struct kn_ops kn_ops_ref;
extern const struct kn_ops kn_ops_avx2;
extern const struct kn_ops kn_ops_avx512;
/* AMX (kernels/arch/amx): prefill GEMMs on the tile unit, the rest AVX-512's. kn_ops_amx_model
 * is the same code over a plain-C model of the tile instructions, linked into the tests only. */
extern const struct kn_ops kn_ops_amx;
extern const struct kn_ops kn_ops_amx_model;

/* The scratch bytes @o's gemm needs over @w for @m activations (0 for a table that needs none).
 * A caller sizes each thread's struct kn_scratch with the largest over its matrices and M. */
size_t kn_gemm_scratch_bytes(const struct kn_ops *o, const struct kn_mat *w, int m);

/* What this CPU and OS support (CPUID, then XGETBV). */
struct kn_cpu {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16, amx;
};
void kn_cpu_probe(struct kn_cpu *c);
/* The table called @want if this machine runs it; NULL or "": the fastest it runs. A @want it
 * cannot run gives ref and a line in @err saying why (else @err is ""; @err may be NULL); the
 * coordinator refuses such a name before it starts workers. Never NULL. */
const struct kn_ops *kn_ops_select(const char *want, char *err, size_t errlen);
/* The table called @name if this machine runs it; else NULL and a line in @err that says what
 * it needs and which tables run here. */
const struct kn_ops *kn_ops_find(const char *name, char *err, size_t errlen);
/* "avx2 avx512 avx512-vnni avx512-bf16, no amx": the features that decide the kernels. */
void kn_cpu_describe(const struct kn_cpu *c, char *buf, size_t len);
/* Every table this machine can run, ref first; returns how many (at most @max). */
int kn_ops_available(const struct kn_ops **out, int max);

/* Software prefetch of a decode GEMV's weight stream (kernels/kn_prefetch.c): none (the
 * hardware prefetcher alone), 4 KiB ahead into L1, or 8 KiB ahead into L2. Which one is fastest
 * depends on the host, so each thread times the calls of every matrix shape it runs in each mode
 * (PF_SAMPLES each, interleaved) once its first matrix comes again (its first pass over
 * the weights faults their pages in), and keeps the mode with the lowest median. A mode changes
 * a call's speed, never its results. */
enum kn_pf { KN_PF_HW = 0, KN_PF_L1 = 1, KN_PF_L2 = 2 };
#define KN_PF_COUNT 3
struct kn_pf_call {
    struct pf_shape *shape; /* NULL: not timed */
    uint64_t t0;
};
/* The mode of a GEMV call over @rows rows of @w on this thread; kn_pf_end after it. */
int kn_pf_begin(struct kn_pf_call *c, const struct kn_mat *w, int rows);
void kn_pf_end(struct kn_pf_call *c);
/* Every call of the calling thread in @mode from now on (-1: tune again as above); other threads
 * keep theirs (a pool's owner sets each member's). */
void kn_pf_force(int mode);
/* "hw", "l1", "l2" -> the mode, "auto" -> -1, anything else -> -2; and back. */
int kn_pf_parse(const char *name);
const char *kn_pf_name(int mode);
/* The mode this thread chose for calls over @rows rows of @w's format and width; -1 while it
 * is still in its first pass or timing them (or never ran one). */
int kn_pf_chosen(const struct kn_mat *w, int rows);
/* Forgets this thread's choices and its first pass: it times every mode again once its first
 * matrix after this comes round again after another. */
void kn_pf_reset(void);
/* The mode kept for the median call times @med[KN_PF_COUNT] of a shape (the tuner's rule). */
int kn_pf_decide(const uint32_t *med);

/* How a model rescales its RoPE frequencies (Hugging Face config.json's rope_scaling; GGUF's
 * rope.scaling.* and rope_freqs). All zero: plain RoPE. */
enum kn_rope_type {
    KN_ROPE_PLAIN = 0,
    KN_ROPE_LLAMA3, /* Llama 3.1: long wavelengths slowed by factor, short kept, a blend between */
    KN_ROPE_YARN,   /* YaRN (Qwen2.5): interpolated and extrapolated frequencies mixed by a ramp
                     * over the rotations beta_slow .. beta_fast in orig_ctx positions, cos/sin
                     * times 0.1 ln(factor) + 1 */
    KN_ROPE_LINEAR, /* position interpolation: every frequency divided by factor, i.e. positions
                     * by factor (transformers' "linear", ggml's freq_scale 1 / factor) */
};
struct kn_rope_scale {
    enum kn_rope_type type;
    float factor;               /* LLAMA3, YARN, LINEAR: the context extension factor, >= 1 */
    int orig_ctx;               /* LLAMA3, YARN: original_max_position_embeddings */
    float low, high;            /* LLAMA3: low_freq_factor < high_freq_factor */
    float beta_fast, beta_slow; /* YARN: 0 means 32 and 1, the papers' and configs' defaults */
    bool exact; /* YARN: the ramp's bounds as computed (transformers' truncate: false); else
                 * floor and ceil of them (ggml's, truncate's default) */
    /* NULL, or head_dim / 2 divisors of the base frequencies, before the type's rescaling:
     * LongRoPE's short or long factors (Phi-3.5), GGUF's rope_freqs tensor */
    const float *freq_factors;
    /* multiplies cos and sin (0: 1); LongRoPE's is kn_rope_longrope_attn(); a YARN type's
     * magnitude multiplies it (as ggml's attn_factor: a config's explicit YaRN
     * attention_factor a, which replaces 0.1 ln(factor) + 1, is a / (0.1 ln(factor) + 1)) */
    float attn_factor;
};
/* RoPE frequencies: inv_freq[i] = 1 / theta^(2i / head_dim) / freq_factors[i], i < head_dim / 2,
 * then rescaled as @s's type says (@s NULL: plain). Returns the magnitude of cos and sin that
 * ops->rope takes (1 unless @s has an attention factor or YaRN). */
float kn_rope_freqs(float *inv_freq, int head_dim, float theta, const struct kn_rope_scale *s);
/* LongRoPE's attention factor: sqrt(1 + ln(factor) / ln(orig_ctx)) for a context of @factor
 * times the original @orig_ctx positions, 1 for factor <= 1. */
float kn_rope_longrope_attn(float factor, int orig_ctx);

/* fp16 / bf16 helpers (round to nearest even). */
uint16_t kn_f32_to_f16(float f);
float kn_f16_to_f32(uint16_t h);
uint16_t kn_f32_to_bf16(float f);
static inline float kn_bf16_to_f32(uint16_t b)
{
    union { uint32_t u; float f; } v = {.u = (uint32_t)b << 16};
    return v.f;
}

/* Quantizers: canonical layout of one matrix from f32 rows (rows, cols) into @out, which has
 * kn_mat_bytes() bytes, on the caller's thread (kn_type_traits' from_float takes a pool). */
void kn_quant_q8(const float *w, int rows, int cols, void *out);
/* KN_DT_Q6: each group's scale the least-error one of a few around max|w| / 32 (its sign giving
 * the group's largest magnitude the 64th level), rows split over @par from KN_QUANT_PAR_MIN
 * weights on (NULL: the caller's thread; the result does not depend on it). */
void kn_quant_q6(const float *w, int rows, int cols, void *out, const struct kn_par *par);
/* Element access in KN_DT_Q6: the code (0..63) of row @r, column @k (32 past cols), and the fp16
 * scale of row @r, group @g (of KN_Q6_GROUP). For references and tests. */
int kn_q6_code(const struct kn_mat *m, int r, int k);
/* Row @r of a KN_DT_Q6 matrix dequantized into @out (cols floats), a block at a time: the
 * embedding of every prompt token reads one (its type traits' to_float). */
void kn_q6_row(const struct kn_mat *m, int r, float *out);
uint16_t kn_q6_scale(const struct kn_mat *m, int r, int g);
/* The offset in a block of KN_DT_Q6 (and of its activations) of the vector byte holding
 * element @e < KN_Q6_BLOCK: 64 v + 4L + j. */
static inline int kn_q6_pos(int e)
{
    int g = e / 32, h = e % 32 / 16, v = e % 16 / 4, j = e % 4;
    return 64 * v + 4 * (g + 8 * h) + j;
}
void kn_quant_w4a16(const float *w, int rows, int cols, int group, void *out);
void kn_quant_w4a8(const float *w, int rows, int cols, int group, void *out);
/* One group's parameters: scale *s (fp16-exact, as stored) and zero point *z (symmetric: 8, codes
 * -8..7 around it; asymmetric: 0..15) minimising sum_i imp[i] * (w[i] - s * (q_i - z))^2 with q the
 * rounded, clamped codes, q_i = clamp(lrintf(w[i] * (1 / s)) + z, 0, 15) in float as kn_quant_w4
 * rounds them; @imp NULL weighs every element 1 (imp values are >= 0, may contain 0; with no
 * weight on any non-zero element, as NULL). The least error over every fp16 scale (and zero
 * point), not an approximation. A symmetric scale may be negative: its sign picks the side of
 * the group that gets the 8th level. A group of zeros gets s = 0. n <= KN_MAX_GROUP. */
void kn_quant_group(const float *w, int n, bool asym, const float *imp, float *s, int *z);
/* A W4 matrix (KN_DT_W4A8 layout when !asym, KN_DT_W4A16 when asym) with per-column importance
 * @imp (cols floats, NULL: uniform), i.e. group g of row r uses imp + g*group. Its rows are
 * split over @par's members from KN_QUANT_PAR_MIN weights on (NULL: all on the caller's
 * thread); the result does not depend on the split. */
#define KN_QUANT_PAR_MIN (1 << 16) /* below it a fan-out costs more than it saves */
void kn_quant_w4(const float *w, int rows, int cols, int group, bool asym, const float *imp,
                 void *out, const struct kn_par *par);
/* Packs given codes (rows x cols bytes, each 0..15, already including the zero point), per-group
 * scales (rows x ngroups floats, fp16-exact) and zero points (rows x ngroups, ignored when !asym)
 * into the W4 layout kn_quant_w4 writes. */
void kn_w4_pack(const uint8_t *codes, const float *scales, const uint8_t *zeros, int rows, int cols,
                int group, bool asym, void *out);
void kn_quant_bf16(const float *w, size_t n, uint16_t *out);
/* Dequantizes row @r of @m into @out (cols floats). */
void kn_mat_row(const struct kn_mat *m, int r, float *out);

#endif
