/* The AMX table compiled over the plain-C model of the tile instructions: kn_ops_amx_model. */
#define KN_AMX_MODEL 1
#include "../kernels/arch/amx/kn_amx.c"
