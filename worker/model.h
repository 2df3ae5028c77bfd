/* worker/: the decoder forward over the weights image a worker has mapped. */
#ifndef SHARDLM_WRK_MODEL_H
#define SHARDLM_WRK_MODEL_H

#include "kn.h"
#include "shlm.h"

#include <stdbool.h>

struct wrk_layer {
    const float *attn_norm, *ffn_norm; /* (dim) */
    struct kn_mat q, k, v, o, gate, up, down;
};

struct wrk_model {
    struct shlm_config cfg;
    const struct kn_ops *ops;
    struct kn_mat embd, head; /* (vocab, dim); head == embd when tied */
    const float *out_norm;    /* (dim) */
    struct wrk_layer *layers; /* (n_layers) */
    int max_m;                /* tokens per forward chunk */
    /* scratch, M = max_m rows each */
    float *x, *xb;     /* (M, dim) residual stream, normed/partial */
    float *q, *k, *v;  /* (M, q_dim), (M, kv_dim), (M, kv_dim) */
    float *att;        /* (M, q_dim) attention output */
    float *hb, *hb2;   /* (M, hidden) */
    float *scores;     /* (seq_len) */
    struct kn_act *a_dim, *a_q, *a_hidden; /* (M) prepared activations of dim, q_dim, hidden */
};

/* Builds the model view over the parsed image @img (which stays mapped while the model lives)
 * with kernel table @ops and chunks of at most @max_m tokens. Returns 0 or -ENOMEM.
 * Release with wrk_model_free(). */
int wrk_model_init(struct wrk_model *m, const struct shlm_model *img, const struct kn_ops *ops,
                   int max_m);
void wrk_model_free(struct wrk_model *m);

/* Runs @n tokens of sequence slot @seq at positions @pos.. through the model, reading and
 * appending keys/values in the KV segment @kv (seg_kv layout, checked by the caller). Writes the
 * logits of every token to @logits (n rows of vocab) if @all_logits, else only the last token's
 * (one row). The caller has validated tokens, positions and slot. */
void wrk_forward(struct wrk_model *m, void *kv, uint32_t seq, const int32_t *tokens, int n,
                 int pos, float *logits, bool all_logits);

#endif
