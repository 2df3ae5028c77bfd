/* SPDX-License-Identifier: MIT */
/* kernels/arch/ref/kn_ref.h: the scalar reference kernels, callable directly (tests, small ops). */
#ifndef SHARDLM_KN_REF_H
#define SHARDLM_KN_REF_H

#include "../../kn.h"

void kn_gemv_f32_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
void kn_gemv_bf16_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
void kn_gemv_q8_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
void kn_gemv_q6_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
void kn_gemv_w4a16_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
void kn_gemv_w4a8_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
/* Any format: kn_mm_check, then the entry of kn_ops_ref.mm for w->dtype. */
void kn_gemv_ref(const struct kn_mat *w, const struct kn_act *x, float *y, int n0, int n1);
void kn_gemm_ref(const struct kn_mat *w, const struct kn_act *x, int m, float *y, int ldy, int n0,
                 int n1);
void kn_rmsnorm_ref(float *o, const float *x, const float *w, int n, float eps);
void kn_rope_ref(float *v, int nheads, int head_dim, int pos, const float *inv_freq, float mscale,
                 bool neox);
void kn_softmax_ref(float *x, int n);
void kn_silu_mul_ref(float *a, const float *b, int n);
void kn_gelu_mul_ref(float *a, const float *b, int n);
void kn_swiglu_oai_mul_ref(float *a, const float *b, int n);
void kn_softcap_ref(float *x, int n, float cap);
void kn_attention_ref(float *out, size_t out_stride, const float *q, size_t q_stride, int nt,
                      int nh, int pos0, const struct kn_kv *kv, int hd, float *scratch,
                      const struct kn_att *opt);

#endif
