/* SPDX-License-Identifier: MIT */
/* Frames of the protocol fuzz targets (fuzz_worker, fuzz_coord): a 2-byte little-endian length,
 * then that many bytes of an Envelope. */
#ifndef SHARDLM_FUZZ_FRAMES_H
#define SHARDLM_FUZZ_FRAMES_H

#include "proto.h"

#include <stddef.h>
#include <stdint.h>

/* The Envelope of the frame at *@off (needs *@off + 2 <= @size; a length past the end takes what
 * is there), *@off moved past it. NULL when it does not unpack or names no message: proto_recv
 * drops those before any handler sees them. Free with proto_free(). */
static inline proto_env *fuzz_next_envelope(const uint8_t *data, size_t size, size_t *off)
{
    size_t len = (size_t)data[*off] | (size_t)data[*off + 1] << 8;
    *off += 2;
    if (len > size - *off)
        len = size - *off;
    proto_env *env = shardlm__envelope__unpack(NULL, len, data + *off);
    *off += len;
    if (env && env->msg_case == SHARDLM__ENVELOPE__MSG__NOT_SET) {
        proto_free(env);
        env = NULL;
    }
    return env;
}

#endif
