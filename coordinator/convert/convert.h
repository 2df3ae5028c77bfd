/* SPDX-License-Identifier: MIT */
/* coordinator/convert/convert.h: `shardlm convert` below the CLI - a GGUF file, a Hugging Face
 * folder or a llama2.c checkpoint (+ tokenizer.bin) into a .shlm file. */
#ifndef SHARDLM_COORD_CONVERT_H
#define SHARDLM_COORD_CONVERT_H

#include "quant.h"
#include "shlm.h"
#include "source.h"
#include "util.h"

#include <signal.h>
#include <stdint.h>

struct coord_convert_opts {
    const char *checkpoint; /* llama2.c checkpoint, GGUF file or Hugging Face directory */
    const char *tokenizer;  /* needed by llama2.c checkpoints only */
    const char *out;
    enum shlm_scheme scheme;
    int group;        /* W4 group; 0 picks the scheme's default (w4a16: 64, w4a8: 128) */
    int head_bits;    /* 8 (default) or 4 */
    uint32_t max_ctx; /* caps the context length (KV cache size); 0: the model's */
    /* How int4 matrices are rounded (quant.h); anything but RTN calibrates first, on the text
     * of the file @calib, or (NULL or "self") on text the model samples itself. */
    enum coord_quant_method method;
    const char *calib;
    int calib_tokens;  /* 0: COORD_CALIB_TOKENS */
    float damp;        /* GPTQ dampening (0: COORD_GPTQ_DAMP) */
    bool no_act_order; /* GPTQ in column order */
    int threads;       /* quantizer and calibration threads (0: the online CPUs) */
    /* --method auto: the bound on the f32 model's held-out log-probabilities it keeps (0:
     * COORD_AUTO_REF_BYTES); the held-out positions past it are not scored (auto.c) */
    size_t heldout_bytes;
    /* When set and nonzero (a signal's number): stop with -ECANCELED, the temporary file
     * removed; seen between tensors, between the calibration's forward steps and between the
     * held-out forward steps of --method auto. */
    volatile sig_atomic_t *cancel;
    /* Calibration progress, when set: a stage ("tokens", "statistics") and its count so far. */
    void (*stage)(void *ctx, const char *stage, long done, long total);
    /* Progress, when set: (0, n) once the file's n tensors are laid out, before the first is
     * written, then (i, n) after the i-th. coord_convert() prints nothing itself. */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
};

/* What --method auto measured (auto.c): each candidate's mean KL divergence from the f32 model
 * on the held-out slice of the calibration text, and its time. */
struct coord_auto_report {
    enum coord_quant_method chosen;
    double kld[COORD_QUANT_AUTO];     /* by method; NAN where the method could not be fitted */
    double seconds[COORD_QUANT_AUTO]; /* its encoding and held-out run */
    double ref_seconds;               /* the f32 reference's held-out run */
    long heldout_tokens;              /* tokens of the held-out slice (BOS included) */
    long heldout_scored; /* of them, the positions scored: the first ones, all but past the
                          * bound on their f32 log-probabilities (coord_convert_opts) */
    size_t heldout_bound; /* that bound, bytes */
};

/* --method auto's default bound on the f32 model's held-out log-probabilities: 512 MiB, all of
 * the default calibration's 512 held-out tokens at a vocabulary of up to 262144 (Gemma 3's);
 * past it (a longer --calib-tokens, a larger vocabulary) the first positions that fit are
 * scored. Beside it, one forward step's logits: at most COORD_AUTO_STEP_BYTES. */
#define COORD_AUTO_REF_BYTES ((size_t)512 << 20)
#define COORD_AUTO_STEP_BYTES ((size_t)64 << 20)

/* What coord_convert() wrote; filled as it goes (n_tensors and file_bytes once the file is
 * laid out, bytes_written after each tensor), so that a progress callback may read it. */
struct coord_convert_info {
    int group; /* W4 group used (0 for f32 and bf16) */
    int n_tensors;
    uint64_t file_bytes;
    uint64_t bytes_written; /* of the tensors */
    long calib_tokens;      /* tokens the statistics came from (0: none) */
    enum coord_quant_method method; /* how the int4 matrices were rounded (auto: its choice) */
    /* a MoE model's experts: calibration does not see them, so every method rounds them to
     * nearest (the file says the method of the others) */
    bool experts_rtn;
    struct coord_auto_report auto_report; /* --method auto only */
};

/* Writes opts->out atomically (a temporary file renamed at the end; nothing is left on error or
 * cancel), and fills @info (may be NULL) on success. Returns 0 or -errno with @e set (the
 * messages name opts->out, never its temporary file), -ECANCELED when opts->cancel was set. */
int coord_convert(const struct coord_convert_opts *o, struct coord_convert_info *info,
                  struct shardlm_err *e);

/* @src in @scheme (f32 or bf16) as a model image in memory (a memfd, mapped): what the
 * calibration runs. Stops with -ECANCELED between tensors once *@cancel (NULL: never) is set.
 * Returns 0 or -errno with @e set; munmap(*@image, *@size) when done. */
int coord_convert_image(struct coord_source *src, enum shlm_scheme scheme,
                        volatile sig_atomic_t *cancel, void **image, size_t *size,
                        struct shardlm_err *e);

struct coord_calib;
struct wrk_pool;
/* @src as @o's scheme, group @group and head bits, rounded by @method (not auto) with the
 * statistics of @calib (unused by rtn), as a model image in memory (a memfd, mapped): the bytes
 * coord_convert writes for that method and calibration. Quantizes on @pool (NULL: this thread).
 * Returns 0 or -errno with @e set (-EDOM: GPTQ found a Hessian singular); munmap(*@image,
 * *@size) when done. */
int coord_convert_image_by(struct coord_source *src, const struct coord_convert_opts *o, int group,
                           enum coord_quant_method method, struct coord_calib *calib,
                           struct wrk_pool *pool, void **image, size_t *size,
                           struct shardlm_err *e);

/* --method auto (auto.c): fits each method on @calib (opened with a held-out slice), measures
 * each one's mean KL divergence from @src in f32 over the held-out slice, and keeps the lowest
 * (rtn unless another is strictly lower): its image in *@image (munmap(*@image, *@size)), what
 * was measured in @r. Returns 0 or -errno with @e set. */
int coord_auto(struct coord_source *src, const struct coord_convert_opts *o, int group,
               struct coord_calib *calib, struct wrk_pool *pool, void **image, size_t *size,
               struct coord_auto_report *r, struct shardlm_err *e);

#endif
