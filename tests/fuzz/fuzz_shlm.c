/* SPDX-License-Identifier: MIT */
/* Fuzz target for the .shlm parser (shm/shlm.c): the bytes are a whole image.
 *
 * Pass 1 parses them as they are. Nearly every mutation breaks file_bytes or the header checksum,
 * which would stop the fuzzer at the first checks, so pass 2 parses a copy with file_bytes set to
 * the input size and the header checksum recomputed: that reaches the config, scheme and tensor
 * table checks. Whenever shlm_parse() accepts, every tensor's data is hashed (shlm_verify_data)
 * and its first and last rows are dequantized through the view, which must stay inside the image:
 * the parser promised that every tensor lies within it. Each pass also parses the head alone
 * (shlm_parse_head, as the streaming load does), and the streaming hash is checked against the
 * one-shot hash on a split of the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kn.h"
#include "shlm.h"

/* Reads what an accepted image promises is readable. */
static void use_model(const struct shlm_model *m)
{
    struct shardlm_err err;
    (void)shlm_verify_data(m, "fuzz", &err);
    for (uint32_t i = 0; i < m->hdr->n_tensors; i++) {
        const struct shlm_tensor *t = &m->tensors[i];
        struct kn_mat v;
        shlm_view(m, t, &v);
        float *row = malloc((size_t)v.cols * sizeof(float));
        if (!row)
            return;
        kn_mat_row(&v, 0, row);
        kn_mat_row(&v, v.rows - 1, row);
        free(row);
        /* lookups by the names the table holds find those entries */
        if (shlm_find(m, t->name) == NULL)
            __builtin_trap();
    }
}

static void parse_one(const uint8_t *data, size_t size)
{
    struct shlm_model m;
    struct shardlm_err err;
    if (shlm_parse(&m, data, size, "fuzz", &err) == 0)
        use_model(&m);
    /* the streaming loader's form: only the bytes before data_offset are there (an exact copy,
     * so a read past them is caught), the file as long as it says */
    if (size >= sizeof(struct shlm_header)) {
        const struct shlm_header *h = (const struct shlm_header *)data;
        size_t avail = h->data_offset < size ? (size_t)h->data_offset : size;
        uint8_t *head = malloc(avail ? avail : 1);
        if (!head)
            return;
        memcpy(head, data, avail);
        if (shlm_parse_head(&m, head, avail, size, "fuzz", &err) == 0 &&
            (m.hdr->data_offset > avail || m.hdr->table_offset > avail))
            __builtin_trap(); /* it promised header, table and tokenizer are in the head */
        free(head);
    }
}

/* The streaming hash equals the one-shot hash for any split of the bytes. */
static void hash_pieces(const uint8_t *data, size_t size)
{
    struct shlm_hasher s;
    size_t cut1 = size ? data[0] % (size + 1) : 0, cut2 = size > 1 ? data[1] % (size + 1) : 0;
    size_t a = cut1 < cut2 ? cut1 : cut2, b = cut1 < cut2 ? cut2 : cut1;
    shlm_hash_init(&s);
    shlm_hash_update(&s, data, a);
    shlm_hash_update(&s, data + a, b - a);
    shlm_hash_update(&s, data + b, size - b);
    if (shlm_hash_final(&s) != shlm_hash(data, size))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a writable copy of exactly @size bytes (so ASan sees any read past the end); malloc's
     * alignment covers the 8-byte fields the parser reads in place */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    hash_pieces(buf, size);
    parse_one(buf, size);

    if (size >= sizeof(struct shlm_header)) {
        struct shlm_header *h = (struct shlm_header *)buf;
        uint64_t table = (uint64_t)h->n_tensors * sizeof(struct shlm_tensor);
        h->file_bytes = size;
        if (h->table_offset <= size && table <= size - h->table_offset) {
            h->checksum = 0;
            h->checksum = shlm_hash(h, sizeof(*h)) ^ shlm_hash(buf + h->table_offset, table);
        }
        parse_one(buf, size);
    }
    free(buf);
    return 0;
}
