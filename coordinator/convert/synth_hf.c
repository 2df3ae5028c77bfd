/* SPDX-License-Identifier: MIT */
#include "synth_internal.h"
#include <errno.h>
int synth_write_hf(const struct synth_model *m, const char *dir,
                   void (*progress)(void *ctx, int done, int total), void *ctx,
                   struct shardlm_err *e)
{
    (void)m; (void)dir; (void)progress; (void)ctx;
    return shardlm_fail(e, -ENOSYS, "todo");
}
