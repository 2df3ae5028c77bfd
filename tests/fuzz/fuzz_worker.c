/* SPDX-License-Identifier: MIT */
/* Fuzz target for the worker's message handlers (worker/serve.c): what a worker does with each
 * message its coordinator sends.
 *
 * Once per process the harness builds a tiny W4A8 model (random weights: 2 layers, dim 64,
 * vocabulary 64, context 16) through the real streaming load into a memfd weights segment, with
 * KV and exchange segments beside it. Each input is then one coordinator's talk to a fresh
 * worker: its first 64 bytes are the 16 token ids in the exchange segment (any int32: ids out of
 * the vocabulary must be refused), the worker is attached to the segments, and the rest is a
 * sequence of frames - a 2-byte little-endian length, then an Envelope - handed to wrk_handle()
 * in order (Steps with any ids, positions, offsets and counts; Rejoin; Attach again, with any
 * paths; Heartbeat; Shutdown ends it). Every reply is packed, as the socket would. Nothing may
 * crash or read out of bounds; a bad message gets an Error reply. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "allreduce.h"
#include "frames.h"
#include "load.h"
#include "serve.h"

#define FRAMES_MAX 32

static struct seg weights, kv, exch;
static const struct kn_ops *ops;

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The tiny model as a .shlm file in a memfd; its path under /proc/self/fd. */
static int write_model(char *path, size_t len)
{
    struct shlm_config c = {.arch = SHLM_ARCH_LLAMA,
                            .dim = 64,
                            .hidden_dim = 96,
                            .n_layers = 2,
                            .n_heads = 4,
                            .n_kv_heads = 2,
                            .head_dim = 16,
                            .vocab_size = 64,
                            .seq_len = 16,
                            .norm_eps = 1e-5f,
                            .rope_theta = 10000.0f,
                            .tied_embd = 1};
    struct shlm_tensor_spec specs[64];
    struct shlm_tensor table[64];
    struct shlm_header h = {0};
    int n = shlm_expected_tensors(&c, &(struct shlm_config_ext){0}, SHLM_SCHEME_W4A8, 32, 8, NULL,
                                  specs, 64);
    if (n <= 0)
        return -1;
    shlm_layout(&h, table, specs, n, 16);
    h.cfg = c;
    h.scheme = SHLM_SCHEME_W4A8;
    h.group = 32;
    h.head_bits = 8;
    h.tok_kind = SHLM_TOK_BLOB;
    h.bos_id = 1;
    h.eos_id = 2;
    uint8_t *img = calloc(1, h.file_bytes);
    if (!img)
        return -1;
    for (int i = 0; i < n; i++) {
        struct kn_mat m;
        kn_mat_view(&m, specs[i].dtype, specs[i].rows, specs[i].cols, specs[i].group,
                    img + table[i].offset);
        if (specs[i].dtype == KN_DT_F32) { /* norms, the head gate: small values */
            float *f = (float *)(img + table[i].offset);
            for (size_t k = 0; k < table[i].bytes / 4; k++)
                f[k] = (float)(next() % 2001) / 10000.0f - 0.1f;
        } else { /* codes any; scales (fp16 / f32) small and finite */
            uint8_t *codes = img + table[i].offset, *sc = (uint8_t *)m.scales;
            for (uint8_t *p = codes; p < sc; p++)
                *p = (uint8_t)next();
            for (uint8_t *p = sc; p < img + table[i].offset + table[i].bytes; p += 2)
                p[0] = 0, p[1] = specs[i].dtype == KN_DT_Q8 ? 0x3c : 0x20;
        }
        table[i].checksum = shlm_hash(img + table[i].offset, table[i].bytes);
    }
    memcpy(img + h.table_offset, table, (size_t)n * sizeof(*table));
    shlm_seal(&h, table);
    memcpy(img, &h, sizeof(h));
    int fd = memfd_create("fuzz-model", 0);
    if (fd < 0 || write(fd, img, h.file_bytes) != (ssize_t)h.file_bytes) {
        free(img);
        return -1;
    }
    free(img);
    snprintf(path, len, "/proc/self/fd/%d", fd);
    return 0;
}

static int setup_once(void)
{
    char path[64];
    struct coord_model_file f;
    struct shardlm_err e;
    struct coord_load_stats st;
    struct shlm_header h;
    static struct shlm_tensor table[SHLM_MAX_TENSORS];
    if (write_model(path, sizeof(path)) || coord_model_open(&f, path, &e) ||
        coord_shard_layout(&f.img, 1, 0, SEG_EXPERTS_TP, &h, table) < 0 ||
        seg_create_on(&weights, "fuzz-weights", h.file_bytes, -1, SEG_ANON | SEG_LAZY) ||
        coord_load_shards(&f, 1, &(struct coord_load_dest){0, &weights}, 1,
                          &(struct coord_load_opts){.io = COORD_IO_BUFFERED}, NULL, NULL, &st,
                          &e)) {
        fprintf(stderr, "fuzz_worker: cannot build the model: %s\n", e.msg);
        abort();
    }
    coord_model_close(&f);
    const struct shlm_config *c = &h.cfg;
    struct seg_plan plan;
    if (seg_plan_of(&plan, &h))
        abort();
    uint32_t kvd = (uint32_t)plan.kv_dim;
    uint32_t nb = 2 * ((c->seq_len + SEG_KV_BLOCK - 1) / SEG_KV_BLOCK); /* two whole contexts */
    struct seg_exchange_dims d = {c->seq_len, c->vocab_size, c->seq_len, 1, c->dim, nb};
    size_t kv_bytes = seg_kv_bytes(nb, c->n_layers, kvd, plan.kv_keys_only);
    size_t x_bytes = seg_exchange_bytes(&d);
    if (seg_create_on(&kv, "fuzz-kv", kv_bytes, -1, SEG_ANON) ||
        seg_create_on(&exch, "fuzz-exchange", x_bytes, -1, SEG_ANON))
        abort();
    seg_kv_init(kv.base, nb, c->n_layers, kvd, plan.kv_keys_only);
    seg_exchange_init(exch.base, &d);
    ops = kn_ops_select(getenv("SHARDLM_ISA"), NULL, 0);
    return 0;
}

/* The socket's part: pack the reply (as proto_send would), then drop it. */
static int sink(struct wrk *w, const proto_env *env)
{
    if (!w->quiet)
        fprintf(stderr, "reply %s\n", proto_case_name(env));
    size_t n = shardlm__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || shardlm__envelope__pack(env, buf) != n)
        __builtin_trap();
    free(buf);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready)
        ready = !setup_once();
    int32_t *tok = seg_exchange_tokens(exch.base);
    memset(tok, 0, 16 * sizeof(int32_t));
    memcpy(tok, data, size < 64 ? size : 64);
    size_t off = size < 64 ? size : 64;
    const struct seg_exchange *x = exch.base;
    /* block tables: the two contexts in order, the first entries from the input */
    uint32_t *blk = seg_exchange_blocks(exch.base);
    for (uint32_t b = 0; b < x->max_blocks; b++)
        blk[b] = b;
    memcpy(blk, data + off, size - off < 16 ? size - off : 16);
    off += size - off < 16 ? size - off : 16;
    seg_ar_init(seg_exchange_ar(exch.base), 1, (size_t)SEG_MAX_CHUNK * 64);

    struct wrk w = {.node = -1, .ops = ops, .send = sink, .quiet = !getenv("FUZZ_WORKER_LOG")};
    Shardlm__Attach a = SHARDLM__ATTACH__INIT;
    a.rank = 0;
    a.n_ranks = 1;
    a.weights_path = weights.path;
    a.kv_path = kv.path;
    a.exchange_path = exch.path;
    a.weights_bytes = weights.size;
    a.kv_bytes = kv.size;
    a.exchange_bytes = x->bytes;
    proto_env att = SHARDLM__ENVELOPE__INIT;
    att.msg_case = SHARDLM__ENVELOPE__MSG_ATTACH;
    att.attach = &a;
    bool stop;
    wrk_handle(&w, &att, &stop);
    if (!w.attached)
        __builtin_trap(); /* the harness's own segments must attach */

    for (int f = 0; f < FRAMES_MAX && off + 2 <= size; f++) {
        proto_env *env = fuzz_next_envelope(data, size, &off);
        if (!env)
            continue;
        wrk_handle(&w, env, &stop);
        proto_free(env);
        if (stop)
            break;
    }
    wrk_detach(&w);
    return 0;
}
