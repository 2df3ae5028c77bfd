/* SPDX-License-Identifier: MIT */
/* coordinator/tok/tokenizer.h: tokenizers - one type, three algorithms, several sources.
 *
 *   COORD_TOK_SPM_LLAMA2C  llama2.c tokenizer.bin: SentencePiece BPE by piece score, plain ' '
 *                          spaces, byte fallback to ids 3 + byte (run.c's rules, exactly).
 *   COORD_TOK_SPM          SentencePiece BPE by piece score as llama.cpp's llm_tokenizer_spm:
 *                          ' ' -> U+2581, dummy prefix, byte fallback to "<0xNN>" pieces
 *                          (GGUF tokenizer.ggml.model "llama").
 *   COORD_TOK_BPE          BPE by merge rank after a regex pre-tokenizer (PCRE2, UTF-8 + UCP):
 *                          GPT-2 byte-level (GGUF "gpt2", HF ByteLevel) or U+2581-escaped with
 *                          "<0xNN>" byte fallback (HF Llama 2 style tokenizer.json).
 *
 * tokenizer.bin: int32 max_token_length, then per token: float score, int32 length, bytes.
 * coord_tok_save() blob (.shlm tok_kind 2, all little-endian):
 *   "SHLMTOK\0", u32 version (1), u32 type, u32 flags, u32 n_vocab, u32 max_token_length,
 *   i32 bos, eos, unk, u32 n_merges, u32 n_patterns,
 *   f32 score[n_vocab], u8 attr[n_vocab], per token u32 length + bytes,
 *   per merge u32 left id + u32 right id (in rank order),
 *   per pattern u32 length + bytes, [version 2 only: u32 length (> 0) + bytes of the chat
 *   template], u64 FNV-1a of everything before it (shlm_fnv1a()). A tokenizer without a chat
 *   template is saved as version 1, as before templates were stored.
 *
 * The files: tokenizer.c (the type, its tables, free, the source a file is), encode.c, decode.c,
 * from_llama2c.c, from_gguf.c, from_hf_json.c, blob.c; tok_internal.h is what they share.
 */
#ifndef SHARDLM_COORD_TOKENIZER_H
#define SHARDLM_COORD_TOKENIZER_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum coord_tok_type {
    COORD_TOK_SPM_LLAMA2C = 0,
    COORD_TOK_SPM = 1,
    COORD_TOK_BPE = 2,
};

/* Token types: the values of GGUF tokenizer.ggml.token_type, in the low bits of attrs[]. */
enum coord_tok_ttype {
    COORD_TOKT_UNDEFINED = 0,
    COORD_TOKT_NORMAL = 1,
    COORD_TOKT_UNKNOWN = 2,
    COORD_TOKT_CONTROL = 3,
    COORD_TOKT_USER_DEFINED = 4,
    COORD_TOKT_UNUSED = 5,
    COORD_TOKT_BYTE = 6,
};
#define COORD_TOKA_TYPE 0x0f   /* attrs[i] & COORD_TOKA_TYPE: enum coord_tok_ttype */
#define COORD_TOKA_LSTRIP 0x10 /* a special token that eats the spaces before it */
#define COORD_TOKA_RSTRIP 0x20 /* ... and after it */

/* What the source declares (struct coord_tok.flags). */
enum coord_tok_flag {
    COORD_TOKF_ADD_BOS = 1u << 0,       /* BOS starts a sequence (add_bos_token) */
    COORD_TOKF_ADD_EOS = 1u << 1,       /* EOS ends one */
    COORD_TOKF_SPACE_PREFIX = 1u << 2,  /* ' ' before the text: SPM dummy prefix, Metaspace
                                         * prepend; byte-level: unless it starts with ' ' */
    COORD_TOKF_PREFIX_FIRST = 1u << 3,  /* ... only before the first fragment, not after each
                                         * special token (Metaspace prepend_scheme "first") */
    COORD_TOKF_BYTE_LEVEL = 1u << 4,    /* GPT-2 bytes-to-unicode pieces */
    COORD_TOKF_ESCAPE_WS = 1u << 5,     /* ' ' is U+2581 in pieces */
    COORD_TOKF_BYTE_FALLBACK = 1u << 6, /* unknown characters become "<0xNN>" pieces */
    COORD_TOKF_IGNORE_MERGES = 1u << 7, /* a pre-token that is a piece is kept whole (Llama 3) */
    COORD_TOKF_NFC = 1u << 8,           /* text is put in Unicode NFC first (Qwen2's normalizer) */
};
#define COORD_TOKF_ALL 0x1ffu

/* coord_tok_encode_ex() flags */
enum coord_tok_enc {
    COORD_TOK_ENC_BOS = 1u << 0,           /* BOS first */
    COORD_TOK_ENC_EOS = 1u << 1,           /* EOS last */
    COORD_TOK_ENC_ADD_SPECIAL = 1u << 2,   /* BOS/EOS as the source declares (ADD_BOS/ADD_EOS) */
    COORD_TOK_ENC_PARSE_SPECIAL = 1u << 3, /* control tokens' text in @text is that token */
};

#define COORD_TOK_MAX_PATTERNS 8
#define COORD_TOK_MAX_VOCAB (1 << 22)
#define COORD_TOK_MAX_PIECE 65536 /* bytes of one piece */

struct coord_tok {
    enum coord_tok_type type;
    int vocab_size;
    int max_token_length; /* bytes of the longest piece (llama2.c: the file's field) */
    int bos_id, eos_id, unk_id; /* -1 when the source has none */
    unsigned flags;             /* enum coord_tok_flag */
    char **vocab;               /* (vocab_size) pieces as stored, NUL-terminated */
    uint32_t *vocab_len;        /* (vocab_size) their bytes (a piece may hold a NUL) */
    float *scores;              /* (vocab_size) SPM merge priority */
    uint8_t *attrs;             /* (vocab_size) enum coord_tok_ttype | COORD_TOKA_* */
    int n_merges;
    int32_t *merges;            /* (n_merges, 3) left, right, merged id, by rank */
    int n_patterns;
    char *patterns[COORD_TOK_MAX_PATTERNS]; /* pre-tokenizer regexes, applied in turn */
    char *chat_template; /* the source's Jinja chat template (NUL-terminated), or NULL */

    /* private to coordinator/tok/ */
    void *re[COORD_TOK_MAX_PATTERNS]; /* pcre2_code_8 * */
    void *mctx;                       /* pcre2_match_context_8 *: match limits */
    char *arena;                      /* the pieces */
    char **dec;                       /* (vocab_size) decoded text of each token */
    uint32_t *dec_len;
    char *dec_arena;
    struct coord_tok_slot {
        int32_t id;    /* -1 empty */
        uint32_t hash; /* of its piece: most misses end here, without reading the piece */
    } *piece_map;      /* open addressing: piece -> id */
    uint32_t piece_mask;
    int32_t *merge_map; /* open addressing: (left, right) -> rank, -1 empty */
    uint32_t merge_mask;
    int32_t *specials; /* (n_specials) ids split out before encoding, longest first */
    int n_specials;
    int32_t char_ids[256];   /* id of each one-byte piece, -1 */
    bool words_apart;        /* SPM: no merge can join a word to the next one's space */
    int32_t byte_ids[256];   /* token of each byte ("<0xNN>" or its GPT-2 character), -1 */
    char byte_pieces[512];   /* "<0xNN>" pieces decode to the single byte NN */
};

/* Parses a tokenizer.bin image of exactly @vocab_size entries (@what names it in errors).
 * Returns 0 or -EINVAL with @e set. Release with coord_tok_free(). */
int coord_tok_init(struct coord_tok *t, const uint8_t *buf, size_t len, int vocab_size,
                   const char *what, struct shardlm_err *e);
/* The number of entries of a tokenizer.bin image that ends exactly after its last entry, or
 * -EINVAL (llama2.c keeps the count in the checkpoint, not in the file). */
int coord_tok_llama2c_count(const uint8_t *buf, size_t len);

struct gguf_file;
/* Builds the tokenizer GGUF @g describes (tokenizer.ggml.*: model "llama" or "gpt2", pre,
 * tokens, scores, token_type, merges, special ids, add_bos/add_eos/add_space_prefix).
 * Returns 0 or -EINVAL (-ENOMEM) with @e naming @what and the key. Release with
 * coord_tok_free(). */
int coord_tok_from_gguf(struct coord_tok *t, const struct gguf_file *g, const char *what,
                        struct shardlm_err *e);
/* The tokenizer.ggml.pre name of byte-level BPE tokenizer @t's regexes (those of a
 * tokenizer.json: "qwen2", "llama-bpe", "deepseek-v3", "gpt-4o", "gpt2"), which
 * coord_tok_from_gguf() reads back as the same splits; NULL for other regexes. */
const char *coord_tok_gguf_pre_name(const struct coord_tok *t);
/* Builds the tokenizer of a Hugging Face tokenizer.json image (@json, @len bytes, need not be
 * NUL-terminated): model BPE, byte-level (ByteLevel pre-tokenizer, Split regexes) or
 * SentencePiece-style (Metaspace or Prepend/Replace "▁" normalizers, byte_fallback);
 * added_tokens (special: control, else user-defined); BOS/EOS from the TemplateProcessing
 * post-processor or the usual names. Returns 0 or -EINVAL (-ENOMEM) with @e set. */
int coord_tok_from_hf_json(struct coord_tok *t, const uint8_t *json, size_t len, const char *what,
                           struct shardlm_err *e);
struct shlm_model;
/* The tokenizer a parsed .shlm image carries (header tok_kind 1: a tokenizer.bin of
 * cfg.vocab_size entries; 2: a coord_tok_save() blob). Returns 0 or -EINVAL with @e set. */
int coord_tok_from_shlm(struct coord_tok *t, const struct shlm_model *m, const char *what,
                        struct shardlm_err *e);
/* The tokenizer of a whole file's image @buf (@size bytes), told apart by its content: a .shlm
 * model, a GGUF file, a tokenizer blob, a tokenizer.json, else a llama2.c tokenizer.bin of
 * @vocab_size entries (0: as many as it holds exactly). Returns 0 or -errno with @e naming
 * @what. Release with coord_tok_free(). */
int coord_tok_from_image(struct coord_tok *t, const uint8_t *buf, size_t size, long vocab_size,
                         const char *what, struct shardlm_err *e);
/* Serializes @t (the format above) into a malloc'd buffer *@buf of *@len bytes; free() it.
 * Returns 0 or -ENOMEM. */
int coord_tok_save(const struct coord_tok *t, uint8_t **buf, size_t *len);
/* Parses a coord_tok_save() blob, checking every length, count, id and the checksum.
 * Returns 0 or -EINVAL (-ENOMEM) with @e set. Release with coord_tok_free(). */
int coord_tok_load(struct coord_tok *t, const uint8_t *buf, size_t len, const char *what,
                   struct shardlm_err *e);
/* Whether @buf starts like a coord_tok_save() blob. */
bool coord_tok_is_blob(const uint8_t *buf, size_t len);
void coord_tok_free(struct coord_tok *t);
#define COORD_TOK_MAX_TEMPLATE (1u << 20) /* bytes of a chat template */
#define COORD_TOK_MAX_EOG 16
/* The tokens that end a generation: EOS, and the control tokens instruct models end a turn with
 * (<|eot_id|>, <|im_end|>, <end_of_turn>, <|end|>... as llama.cpp lists them), told by their
 * text; gpt-oss' <|return|> and <|call|> but not its <|end|>, which ends a message of the turn.
 * Writes at most COORD_TOK_MAX_EOG ids to @out; returns the count. */
int coord_tok_eog_ids(const struct coord_tok *t, int32_t *out);
/* Stores a copy of chat template @s (@n bytes: UTF-8 without NUL, at most
 * COORD_TOK_MAX_TEMPLATE) in @t, replacing any. Returns 0 or -EINVAL / -ENOMEM with @e set. */
int coord_tok_set_chat_template(struct coord_tok *t, const char *s, size_t n, const char *what,
                                struct shardlm_err *e);

/* Encodes @text. COORD_TOK_SPM_LLAMA2C follows llama2.c (dummy-prefix space, UTF-8 characters
 * or byte fallback, then best-score pair merges); the others follow llama.cpp's llama_tokenize:
 * user-defined tokens are split out first (control tokens too with PARSE_SPECIAL), then each
 * fragment is encoded. @len: bytes of @text (it may hold NULs). Writes at most @max ids to @out;
 * returns the count, or -ENOSPC when @max is too small, -EILSEQ for a character the vocabulary
 * cannot spell (no byte tokens), -EINVAL when a pre-tokenizer regex fails (match limit),
 * -ENOMEM. */
int coord_tok_encode_ex(const struct coord_tok *t, const char *text, size_t len, unsigned flags,
                        int32_t *out, int max);
/* coord_tok_encode_ex() that says why it failed in @e ("the pre-tokenizer's regex failed on the
 * text near byte N: PCRE2 says \"match limit exceeded\" ...", "a character this vocabulary
 * cannot spell", ...), for a caller to prefix with what it was tokenizing. */
int coord_tok_encode_err(const struct coord_tok *t, const char *text, size_t len, unsigned flags,
                         int32_t *out, int max, struct shardlm_err *e);
/* coord_tok_encode_ex() of a NUL-terminated @text with BOS and EOS on request. */
int coord_tok_encode(const struct coord_tok *t, const char *text, bool bos, bool eos, int32_t *out,
                     int max);
/* The text of @token following @prev (-1 at the start). llama2.c: a leading space after BOS is
 * dropped, "<0xNN>" pieces are that byte. Others: control and unknown tokens are empty, byte
 * tokens their byte, byte-level pieces their bytes, U+2581 a space; with a dummy prefix, the
 * leading space after the start or a special token is dropped. Never NULL; *@len gets the byte
 * count (pieces may contain NUL bytes). Valid while @t is. */
const char *coord_tok_decode(const struct coord_tok *t, int prev, int token, size_t *len);
/* The text of @token inside a text, after an ordinary token (no dummy-prefix rule): what a
 * grammar sees of it. Never NULL; *@len gets the byte count. Valid while @t is. */
const char *coord_tok_text(const struct coord_tok *t, int token, size_t *len);
/* Whether a decoded piece is worth printing (llama2.c safe_printf: a lone ASCII control byte
 * is not; a lone byte past ASCII is, as a part of a character: see coord_utf8_feed()). */
bool coord_tok_printable(const char *piece, size_t len);

/* Text streamed piece by piece (llama.cpp's rule): a UTF-8 character split over pieces (byte
 * tokens) is held back until it is whole; ill-formed bytes print as U+FFFD (EF BF BD), one for
 * each maximal part of a character that cannot go on (Unicode's substitution practice). Zero it
 * to start. */
struct coord_utf8 {
    unsigned char held[4];
    uint8_t n, need; /* bytes held, bytes of the character they start */
};
/* Feeds the @n bytes of @in; writes what can be printed to @out, which has room for 3 * @n + 12
 * bytes, and returns its length. */
size_t coord_utf8_feed(struct coord_utf8 *u, const char *in, size_t n, char *out);
/* Ends the stream: a character still incomplete becomes U+FFFD, into @out (room for 3 bytes).
 * Returns the length (0 or 3). */
size_t coord_utf8_flush(struct coord_utf8 *u, char *out);

#endif
