/* SPDX-License-Identifier: MIT */
/* Fuzz target for the server's look at a request head before libmicrohttpd reads it
 * (coordinator/server/gate.c).
 *
 * Input: the first bytes of a connection, any bytes. coord_gate_head_len() finds the head's
 * end within them (or 0), ending in a line feed; coord_gate_head_error() reads only that head,
 * and a refusal is one line. The input is copied to a buffer of its exact size, so ASan sees a
 * read past it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    size_t len = coord_gate_head_len(buf, size);
    if (len > size || (len && buf[len - 1] != '\n'))
        __builtin_trap();
    const char *why = coord_gate_head_error(buf, len ? len : size);
    if (why && (!*why || strchr(why, '\n')))
        __builtin_trap();
    free(buf);
    return 0;
}
