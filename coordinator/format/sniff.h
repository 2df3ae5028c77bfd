/* SPDX-License-Identifier: MIT */
/* coordinator/format/sniff.h: which format a file holds, told apart by its content (magic bytes,
 * or a folder), for every command that takes "a model" or "a tokenizer". Each caller decides
 * which formats it accepts and what it tells the user about the others. */
#ifndef SHARDLM_COORD_SNIFF_H
#define SHARDLM_COORD_SNIFF_H

#include "util.h"

#include <stddef.h>
#include <stdint.h>

enum coord_format {
    COORD_FORMAT_OTHER,    /* no magic of ours: a llama2.c checkpoint or tokenizer.bin (which have
                            * none), or nothing we read */
    COORD_FORMAT_SHLM,     /* a .shlm model or weights segment (SHLM_MAGIC, 8 bytes) */
    COORD_FORMAT_GGUF,     /* "GGUF" */
    COORD_FORMAT_TOK_BLOB, /* a coord_tok_save() blob (COORD_FORMAT_TOK_BLOB_MAGIC, 8 bytes) */
    COORD_FORMAT_JSON,     /* '{' after white space: a tokenizer.json */
    COORD_FORMAT_HF_DIR,   /* a folder: a Hugging Face model (config.json, *.safetensors, ...) */
};

/* The first 8 bytes of a tokenizer blob, NUL included (tok/tokenizer.c writes it). */
#define COORD_FORMAT_TOK_BLOB_MAGIC "SHLMTOK"

/* The format of the image @buf of @size bytes (a whole file, or its first bytes): SHLM, GGUF,
 * TOK_BLOB, JSON (white space before the '{' is scanned to the end of @buf) or OTHER; never
 * HF_DIR. */
enum coord_format coord_format_sniff_image(const uint8_t *buf, size_t size);

/* The format of @path: HF_DIR for a folder, else that of its first bytes (as
 * coord_format_sniff_image(); JSON only when the '{' is within the first 4096 bytes). Opens a
 * regular file without blocking (a FIFO or device is refused, not waited on). Returns 0 with
 * *@fmt set, or -errno with @e naming @path ("<path>: No such file or directory", "<path>: FIFO,
 * not a regular file", ...). */
int coord_format_sniff(const char *path, enum coord_format *fmt, struct shardlm_err *e);

#endif
