/* Fuzz target for the .shlm parser (shm/shlm.c): the bytes are a whole image.
 *
 * Pass 1 parses them as they are. Nearly every mutation breaks file_bytes or the header checksum,
 * which would stop the fuzzer at the first checks, so pass 2 parses a copy with file_bytes set to
 * the input size and the header checksum recomputed: that reaches the config, scheme and tensor
 * table checks. Whenever shlm_parse() accepts, every tensor's data is hashed (shlm_verify_data)
 * and its first and last rows are dequantized through the view, which must stay inside the image:
 * the parser promised that every tensor lies within it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kn.h"
#include "shlm.h"

/* Reads what an accepted image promises is readable. */
static void use_model(const struct shlm_model *m)
{
    char err[256];
    (void)shlm_verify_data(m, "fuzz", err, sizeof(err));
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
    char err[256];
    if (shlm_parse(&m, data, size, "fuzz", err, sizeof(err)) == 0)
        use_model(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a writable copy of exactly @size bytes (so ASan sees any read past the end); malloc's
     * alignment covers the 8-byte fields the parser reads in place */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
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
