/* SPDX-License-Identifier: MIT */
/* Fuzz target for the Envelope decoder (the generated proto/shardlm.pb-c.c over libprotobuf-c),
 * which proto_recv() runs on every frame a peer sends.
 *
 * The bytes are one frame. When they unpack, the message is packed again and that packing
 * unpacked and packed once more: both packings must have the same size and the same bytes (a
 * re-encoding is canonical: known fields in field order, unknown fields kept after them).
 *
 * Known libprotobuf-c (1.4.1) leniency, skipped here: a field number 0, invalid in protobuf,
 * is refused when its tag is one byte (00) but accepted as an unknown field when the tag is an
 * over-long varint (80 80 00); it is then packed as 00, which the same library refuses. shardlm
 * ignores unknown fields and never forwards a received Envelope, so nothing depends on it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shardlm.pb-c.h"

static int zero_in(const ProtobufCMessage *m)
{
    for (unsigned i = 0; m && i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    return 0;
}

/* Whether @e or a message inside it holds an unknown field numbered 0 (see above). */
static int has_field_zero(const Shardlm__Envelope *e)
{
    if (zero_in(&e->base))
        return 1;
    if (e->msg_case == SHARDLM__ENVELOPE__MSG__NOT_SET)
        return 0;
    /* the oneof is a union of message pointers: any member reads the one that is set */
    if (zero_in((const ProtobufCMessage *)e->hello))
        return 1;
    if (e->msg_case == SHARDLM__ENVELOPE__MSG_STEP)
        for (size_t i = 0; i < e->step->n_seqs; i++)
            if (zero_in(&e->step->seqs[i]->base))
                return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Shardlm__Envelope *a = shardlm__envelope__unpack(NULL, size, data);
    if (!a)
        return 0;
    /* proto_case_name() and the receivers switch on this */
    if ((unsigned)a->msg_case > SHARDLM__ENVELOPE__MSG_REJOIN) /* the last case */
        __builtin_trap();
    size_t na = shardlm__envelope__get_packed_size(a);
    uint8_t *pa = malloc(na ? na : 1);
    if (!pa || shardlm__envelope__pack(a, pa) != na)
        __builtin_trap();

    Shardlm__Envelope *b = shardlm__envelope__unpack(NULL, na, pa);
    if (!b && has_field_zero(a)) {
        free(pa);
        shardlm__envelope__free_unpacked(a, NULL);
        return 0;
    }
    if (!b || b->msg_case != a->msg_case)
        __builtin_trap();
    size_t nb = shardlm__envelope__get_packed_size(b);
    if (nb != na)
        __builtin_trap();
    uint8_t *pb = malloc(nb ? nb : 1);
    if (!pb || shardlm__envelope__pack(b, pb) != nb || memcmp(pa, pb, na) != 0)
        __builtin_trap();

    free(pb);
    shardlm__envelope__free_unpacked(b, NULL);
    free(pa);
    shardlm__envelope__free_unpacked(a, NULL);
    return 0;
}
