/* worker/: llama-family decoder forward, M tokens of one sequence at a time. */
#include "model.h"

#include "seg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void view(const struct shlm_model *img, const char *name, struct kn_mat *out)
{
    const struct shlm_tensor *t = shlm_find(img, name);
    KN_ASSERT(t); /* shlm_parse() checked that every expected tensor is present */
    shlm_view(img, t, out);
}

static const float *vec(const struct shlm_model *img, const char *name)
{
    struct kn_mat v;
    view(img, name, &v);
    KN_ASSERT(v.dtype == KN_DT_F32);
    return v.codes;
}

static int acts_alloc(struct kn_act **out, int n, int k, int group)
{
    *out = calloc((size_t)n, sizeof(**out));
    if (!*out)
        return -ENOMEM;
    for (int i = 0; i < n; i++)
        if (kn_act_alloc(&(*out)[i], k, group))
            return -ENOMEM;
    return 0;
}

static void acts_free(struct kn_act *a, int n)
{
    for (int i = 0; a && i < n; i++)
        kn_act_free(&a[i]);
    free(a);
}

int wrk_model_init(struct wrk_model *m, const struct shlm_model *img, const struct kn_ops *ops,
                   int max_m)
{
    memset(m, 0, sizeof(*m));
    const struct shlm_config *c = &img->hdr->cfg;
    m->cfg = *c;
    m->ops = ops;
    m->max_m = max_m;
    view(img, "tok_embd", &m->embd);
    if (c->tied_embd)
        m->head = m->embd;
    else
        view(img, "output", &m->head);
    m->out_norm = vec(img, "output_norm");
    m->layers = calloc(c->n_layers, sizeof(*m->layers));
    if (!m->layers)
        return -ENOMEM;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        struct wrk_layer *L = &m->layers[l];
        char nm[SHLM_NAME_MAX];
#define MAT(field, suffix)                                                                         \
    snprintf(nm, sizeof(nm), "blk.%u." suffix, l);                                                 \
    view(img, nm, &L->field)
        MAT(q, "attn_q");
        MAT(k, "attn_k");
        MAT(v, "attn_v");
        MAT(o, "attn_o");
        MAT(gate, "ffn_gate");
        MAT(up, "ffn_up");
        MAT(down, "ffn_down");
#undef MAT
        snprintf(nm, sizeof(nm), "blk.%u.attn_norm", l);
        L->attn_norm = vec(img, nm);
        snprintf(nm, sizeof(nm), "blk.%u.ffn_norm", l);
        L->ffn_norm = vec(img, nm);
    }
    size_t M = (size_t)max_m, dim = c->dim, qd = (size_t)c->n_heads * c->head_dim;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, hid = c->hidden_dim;
    /* the activation group must match the W4 tensors' group; other formats ignore it */
    int group = img->hdr->group ? (int)img->hdr->group : 32;
    m->x = malloc(M * dim * sizeof(float));
    m->xb = malloc(M * dim * sizeof(float));
    m->q = malloc(M * qd * sizeof(float));
    m->k = malloc(M * kvd * sizeof(float));
    m->v = malloc(M * kvd * sizeof(float));
    m->att = malloc(M * qd * sizeof(float));
    m->hb = malloc(M * hid * sizeof(float));
    m->hb2 = malloc(M * hid * sizeof(float));
    m->scores = malloc((size_t)c->seq_len * sizeof(float));
    if (!m->x || !m->xb || !m->q || !m->k || !m->v || !m->att || !m->hb || !m->hb2 ||
        !m->scores || acts_alloc(&m->a_dim, max_m, (int)dim, group) ||
        acts_alloc(&m->a_q, max_m, (int)qd, group) ||
        acts_alloc(&m->a_hidden, max_m, (int)hid, group)) {
        wrk_model_free(m);
        return -ENOMEM;
    }
    return 0;
}

void wrk_model_free(struct wrk_model *m)
{
    free(m->layers);
    free(m->x);
    free(m->xb);
    free(m->q);
    free(m->k);
    free(m->v);
    free(m->att);
    free(m->hb);
    free(m->hb2);
    free(m->scores);
    acts_free(m->a_dim, m->max_m);
    acts_free(m->a_q, m->max_m);
    acts_free(m->a_hidden, m->max_m);
    memset(m, 0, sizeof(*m));
}

/* rows of @src (n, k) into prepared activations */
static void prepare(struct kn_act *a, const float *src, int n, int k)
{
    for (int i = 0; i < n; i++)
        kn_act_prepare(&a[i], src + (size_t)i * (size_t)k);
}

static void add_rows(float *x, const float *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += d[i];
}

/* One chunk of n <= max_m tokens; @logits NULL: no head (a prefill chunk before the last). */
static void forward_chunk(struct wrk_model *m, void *kv, uint32_t seq, const int32_t *tokens,
                          int n, int pos, float *logits, bool all_logits)
{
    const struct kn_ops *ops = m->ops;
    const struct shlm_config *c = &m->cfg;
    int dim = (int)c->dim, hd = (int)c->head_dim, nh = (int)c->n_heads, nkv = (int)c->n_kv_heads;
    int qd = nh * hd, kvd = nkv * hd, hid = (int)c->hidden_dim;

    for (int i = 0; i < n; i++)
        kn_mat_row(&m->embd, tokens[i], m->x + (size_t)i * dim);

    for (uint32_t l = 0; l < c->n_layers; l++) {
        const struct wrk_layer *L = &m->layers[l];
        float *kc = seg_kv_keys(kv, seq, l), *vc = seg_kv_values(kv, seq, l);

        for (int i = 0; i < n; i++)
            ops->rmsnorm(m->xb + (size_t)i * dim, m->x + (size_t)i * dim, L->attn_norm, dim,
                         c->norm_eps);
        prepare(m->a_dim, m->xb, n, dim);
        ops->gemm(&L->q, m->a_dim, n, m->q, qd, 0, qd);
        ops->gemm(&L->k, m->a_dim, n, m->k, kvd, 0, kvd);
        ops->gemm(&L->v, m->a_dim, n, m->v, kvd, 0, kvd);
        for (int i = 0; i < n; i++) {
            float *qi = m->q + (size_t)i * qd, *ki = m->k + (size_t)i * kvd;
            ops->rope(qi, nh, hd, pos + i, c->rope_theta, c->rope_neox);
            ops->rope(ki, nkv, hd, pos + i, c->rope_theta, c->rope_neox);
            memcpy(kc + (size_t)(pos + i) * kvd, ki, (size_t)kvd * sizeof(float));
            memcpy(vc + (size_t)(pos + i) * kvd, m->v + (size_t)i * kvd,
                   (size_t)kvd * sizeof(float));
        }
        for (int i = 0; i < n; i++)
            ops->attention(m->att + (size_t)i * qd, m->q + (size_t)i * qd, kc, vc, kvd, pos + i,
                           nh, nkv, hd, m->scores);
        prepare(m->a_q, m->att, n, qd);
        ops->gemm(&L->o, m->a_q, n, m->xb, dim, 0, dim);
        add_rows(m->x, m->xb, (size_t)n * dim);

        for (int i = 0; i < n; i++)
            ops->rmsnorm(m->xb + (size_t)i * dim, m->x + (size_t)i * dim, L->ffn_norm, dim,
                         c->norm_eps);
        prepare(m->a_dim, m->xb, n, dim);
        ops->gemm(&L->gate, m->a_dim, n, m->hb, hid, 0, hid);
        ops->gemm(&L->up, m->a_dim, n, m->hb2, hid, 0, hid);
        for (int i = 0; i < n; i++)
            ops->silu_mul(m->hb + (size_t)i * hid, m->hb2 + (size_t)i * hid, hid);
        prepare(m->a_hidden, m->hb, n, hid);
        ops->gemm(&L->down, m->a_hidden, n, m->xb, dim, 0, dim);
        add_rows(m->x, m->xb, (size_t)n * dim);
    }

    if (!logits)
        return;
    int first = all_logits ? 0 : n - 1;
    for (int i = first; i < n; i++) {
        ops->rmsnorm(m->xb, m->x + (size_t)i * dim, m->out_norm, dim, c->norm_eps);
        kn_act_prepare(&m->a_dim[0], m->xb);
        float *row = logits + (size_t)(i - first) * c->vocab_size;
        ops->gemv(&m->head, &m->a_dim[0], row, 0, (int)c->vocab_size);
    }
}

void wrk_forward(struct wrk_model *m, void *kv, uint32_t seq, const int32_t *tokens, int n,
                 int pos, float *logits, bool all_logits)
{
    for (int done = 0; done < n;) {
        int chunk = n - done < m->max_m ? n - done : m->max_m;
        float *out = NULL; /* only the final chunk has logits unless all rows are wanted */
        if (all_logits)
            out = logits + (size_t)done * m->cfg.vocab_size;
        else if (done + chunk == n)
            out = logits;
        forward_chunk(m, kv, seq, tokens + done, chunk, pos + done, out, all_logits);
        done += chunk;
    }
}
