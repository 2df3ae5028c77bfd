/* SPDX-License-Identifier: MIT */
/* tests/amx_model.h: the plain-C model of the AMX tile instructions (tests/amx_tile_model.c),
 * which kernels/arch/amx/kn_amx.c runs on as kn_ops_amx_model (tests/amx_model.c). */
#ifndef SHARDLM_AMX_MODEL_H
#define SHARDLM_AMX_MODEL_H

#include <stdbool.h>
#include <stddef.h>

/* The instructions, per thread as on the hardware (Intel SDM vol. 2). LDTILECFG of a 64-byte
 * configuration (palette 0 releases), TILERELEASE, and the tile operations, which need a loaded
 * configuration and shapes it allows: a tile op without one, after a release, on a tile it
 * leaves unconfigured or on shapes that do not match is not executed but recorded as a fault
 * (the hardware raises #UD). */
void amx_model_loadconfig(const void *cfg);
void amx_model_release(void);
void amx_model_zero(int t);
void amx_model_loadd(int t, const void *base, size_t stride);
void amx_model_stored(int t, void *base, size_t stride);
void amx_model_dpbsud(int c, int a, int b);   /* int32 C += signed A bytes x unsigned B bytes */
void amx_model_dpbf16ps(int c, int a, int b); /* fp32 C += bf16 pairs of A x bf16 pairs of B */

/* Whether this thread holds a tile configuration (loaded and not released). */
bool amx_model_configured(void);
/* The faults recorded so far by every thread, and the first one's message in @msg (may be
 * NULL); amx_model_faults_clear() forgets them. */
int amx_model_faults(char *msg, size_t len);
void amx_model_faults_clear(void);

#endif
