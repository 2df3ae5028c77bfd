/* SPDX-License-Identifier: MIT */
/* tests/amx_model.c: the AMX table compiled over the plain-C model of the tile instructions
 * (tests/amx_tile_model.c): kn_ops_amx_model. Built with the AVX-512 flags (its epilogue is
 * AVX-512), so it runs on an AVX-512 CPU; the model itself runs anywhere. */
#include "amx_model.h"

#define KN_AMX_MODEL 1
#include "../kernels/arch/amx/kn_amx.c"
