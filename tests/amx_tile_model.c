/* SPDX-License-Identifier: MIT */
/* tests/amx_tile_model.c: a plain-C model of the AMX tile instructions the kernels use, the tile
 * configuration included (Intel SDM vol. 2: LDTILECFG, TILERELEASE, TILEZERO, TILELOADD,
 * TILESTORED, TDPBSUD, TDPBF16PS; palette 1: 8 tiles of at most 16 rows x 64 bytes). Built
 * without ISA flags, so it runs on any x86-64 CPU. What the hardware would fault on (#UD, #GP)
 * is not executed but recorded, for the tests to check (amx_model_faults). */
#include "amx_model.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kn.h"

#define N_TILES 8
#define MAX_ROWS 16
#define MAX_COLSB 64

/* One thread's tile state, as XTILECFG and XTILEDATA are per thread. */
struct tile_state {
    bool configured;
    uint8_t rows[N_TILES];
    uint16_t colsb[N_TILES];
    uint8_t t[N_TILES][MAX_ROWS][MAX_COLSB];
};
static _Thread_local struct tile_state st;

static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static int n_faults;
static char first_fault[256];

static void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fault(const char *fmt, ...)
{
    pthread_mutex_lock(&fault_lock);
    if (!n_faults++) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(first_fault, sizeof(first_fault), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&fault_lock);
}

int amx_model_faults(char *msg, size_t len)
{
    pthread_mutex_lock(&fault_lock);
    int n = n_faults;
    if (msg && len)
        snprintf(msg, len, "%s", first_fault);
    pthread_mutex_unlock(&fault_lock);
    return n;
}

void amx_model_faults_clear(void)
{
    pthread_mutex_lock(&fault_lock);
    n_faults = 0;
    first_fault[0] = 0;
    pthread_mutex_unlock(&fault_lock);
}

bool amx_model_configured(void) { return st.configured; }

/* TILERELEASE: the init state, no configuration and every tile zero. */
void amx_model_release(void) { memset(&st, 0, sizeof(st)); }

/* LDTILECFG: byte 0 the palette (0: the init state), byte 1 start_row, 2-15 reserved, then
 * colsb[16] (uint16) at 16 and rows[16] at 48. Loading zeroes every tile. A configuration the
 * palette does not allow faults (#GP) and leaves none loaded. */
void amx_model_loadconfig(const void *cfg)
{
    const uint8_t *b = cfg;
    amx_model_release();
    if (b[0] == 0)
        return;
    if (b[0] != 1) {
        fault("LDTILECFG: palette %u, this model has palette 1 only", b[0]);
        return;
    }
    for (int i = 1; i < 16; i++)
        if (b[i]) {
            fault("LDTILECFG: byte %d (start_row or reserved) is %u, not 0", i, b[i]);
            return;
        }
    for (int t = 0; t < 16; t++) {
        uint16_t colsb;
        memcpy(&colsb, b + 16 + 2 * t, 2);
        uint8_t rows = b[48 + t];
        bool ok = t < N_TILES ? rows <= MAX_ROWS && colsb <= MAX_COLSB && !rows == !colsb
                              : !rows && !colsb;
        if (!ok) {
            fault("LDTILECFG: tile %d of %u rows x %u bytes: palette 1 allows 8 tiles of at "
                  "most 16 x 64, both zero or neither",
                  t, rows, colsb);
            amx_model_release();
            return;
        }
        if (t < N_TILES) {
            st.rows[t] = rows;
            st.colsb[t] = colsb;
        }
    }
    st.configured = true;
}

/* Whether instruction @what may use tile @t: a configuration is loaded and configures @t. */
static bool usable(const char *what, int t)
{
    if (!st.configured) {
        fault("%s tmm%d without a tile configuration (no LDTILECFG, or after TILERELEASE)", what,
              t);
        return false;
    }
    if (t < 0 || t >= N_TILES || !st.rows[t]) {
        fault("%s tmm%d: a tile the loaded configuration leaves unused", what, t);
        return false;
    }
    return true;
}

void amx_model_zero(int t)
{
    if (usable("TILEZERO", t))
        memset(st.t[t], 0, sizeof(st.t[t]));
}

/* TILELOADD: rows[t] rows of colsb[t] bytes, @stride apart; the rest of the tile zero. */
void amx_model_loadd(int t, const void *base, size_t stride)
{
    if (!usable("TILELOADD", t))
        return;
    memset(st.t[t], 0, sizeof(st.t[t]));
    for (int r = 0; r < st.rows[t]; r++)
        memcpy(st.t[t][r], (const uint8_t *)base + (size_t)r * stride, st.colsb[t]);
}

void amx_model_stored(int t, void *base, size_t stride)
{
    if (!usable("TILESTORED", t))
        return;
    for (int r = 0; r < st.rows[t]; r++)
        memcpy((uint8_t *)base + (size_t)r * stride, st.t[t][r], st.colsb[t]);
}

/* The shapes of C (M x 4N bytes) += A (M x 4K) . B (K x 4N), three distinct tiles (#UD
 * otherwise); sets *m, *n, *k. */
static bool dp_shapes(const char *what, int c, int a, int b, int *m, int *n, int *k)
{
    if (!usable(what, c) || !usable(what, a) || !usable(what, b))
        return false;
    if (c == a || c == b || a == b) {
        fault("%s tmm%d, tmm%d, tmm%d: the tiles must differ", what, c, a, b);
        return false;
    }
    *m = st.rows[c];
    *n = st.colsb[c] / 4;
    *k = st.colsb[a] / 4;
    if (st.rows[a] != *m || st.colsb[b] != st.colsb[c] || st.rows[b] != *k || st.colsb[a] % 4 ||
        st.colsb[c] % 4) {
        fault("%s: C %ux%u, A %ux%u, B %ux%u (rows x bytes) do not make C += A . B", what,
              st.rows[c], st.colsb[c], st.rows[a], st.colsb[a], st.rows[b], st.colsb[b]);
        return false;
    }
    return true;
}

/* TDPBSUD: C[m][n] (int32) += sum_k,j A[m][4k + j] (signed) * B[k][4n + j] (unsigned). */
void amx_model_dpbsud(int c, int a, int b)
{
    int M, N, K;
    if (!dp_shapes("TDPBSUD", c, a, b, &M, &N, &K))
        return;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t acc;
            memcpy(&acc, &st.t[c][m][4 * n], 4);
            for (int k = 0; k < K; k++)
                for (int j = 0; j < 4; j++)
                    acc += (int32_t)(int8_t)st.t[a][m][4 * k + j] * (int32_t)st.t[b][k][4 * n + j];
            memcpy(&st.t[c][m][4 * n], &acc, 4);
        }
}

static float bf16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kn_bf16_to_f32(h);
}

/* TDPBF16PS: C[m][n] (fp32) += sum_k A[m][2k] * B[k][2n] + A[m][2k + 1] * B[k][2n + 1], A and B
 * bf16 pairs (the hardware's rounding of the sums may differ: the tests allow for it). */
void amx_model_dpbf16ps(int c, int a, int b)
{
    int M, N, K;
    if (!dp_shapes("TDPBF16PS", c, a, b, &M, &N, &K))
        return;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc;
            memcpy(&acc, &st.t[c][m][4 * n], 4);
            for (int k = 0; k < K; k++)
                for (int j = 0; j < 2; j++)
                    acc +=
                        bf16_at(&st.t[a][m][4 * k + 2 * j]) * bf16_at(&st.t[b][k][4 * n + 2 * j]);
            memcpy(&st.t[c][m][4 * n], &acc, 4);
        }
}
