/* SPDX-License-Identifier: MIT */
/* coordinator/engine/load.h: the streaming load of a .shlm file into the weights segments. */

/* The file is read once, front to back, in jobs of whole rows of one tensor (at most
 * COORD_LOAD_CHUNK bytes each) through io_uring, COORD_LOAD_DEPTH of them in flight, O_DIRECT
 * where the filesystem takes it. A tensor's scales (and zero points) are read first, then its
 * codes job by job: each job is checksummed in file order and at once repacked into every rank
 * that holds some of its rows - canonical slices straight into the segment, tiles through a
 * staging area of COORD_LOAD_STEP rows per rank. What the load holds besides the segments is the
 * queue, one tensor's scales and the staging areas: a few MiB, whatever the model.
 */
#ifndef SHARDLM_COORD_LOAD_H
#define SHARDLM_COORD_LOAD_H

#include "log.h"
#include "plan.h"
#include "seg.h"
#include "shlm.h"
#include "util.h"

#include <limits.h>
#include <stdint.h>
#include <sys/stat.h>

#define COORD_LOAD_CHUNK (1u << 20) /* bytes of codes per read job */
#define COORD_LOAD_DEPTH 4          /* read jobs in flight */
#define COORD_LOAD_STEP 256         /* rows of a rank's tile staging area */
#define COORD_HEAD_MAX (64u << 20)  /* header, table and tokenizer together */

/* How the file is read. auto: buffered when most of the file is in the page cache already,
 * else O_DIRECT (buffered with POSIX_FADV_DONTNEED behind the read front where O_DIRECT is
 * refused, e.g. on tmpfs). */
enum coord_io { COORD_IO_AUTO = 0, COORD_IO_DIRECT, COORD_IO_BUFFERED };
/* Returns 0 and sets *@out, or -EINVAL for a name that is not auto, direct or buffered. */
int coord_io_parse(const char *name, enum coord_io *out);

/* How the weights get into shared memory (the engine's options, coord_load_shards'). */
struct coord_load_opts {
    bool no_persist; /* memfd segments that go with the processes, instead of persistent ones */
    enum coord_io io;
    bool stats;   /* the caller reports the load at the end (the engine keeps the figures anyway) */
    bool verify;  /* check a persistent segment's data against its checksums before using it */
    size_t chunk; /* bytes of codes per read job; 0: COORD_LOAD_CHUNK (tests set odd sizes to get
                   * ragged chunks) */
    enum seg_experts experts; /* a MoE model's placement over the ranks (plan.h) */
};

/* An opened model file: its header, table and tokenizer read and checked; the data not yet. */
struct coord_model_file {
    char path[PATH_MAX];
    int fd;
    struct stat st;        /* at open, compared again after the load */
    uint8_t *head;         /* bytes [0, data_offset) of the file */
    struct shlm_model img; /* parsed from head: tensor data is not there */
};
/* Returns 0 or -errno with @e set. Release with coord_model_close() (also after an error). */
int coord_model_open(struct coord_model_file *f, const char *path, struct shardlm_err *e);
void coord_model_close(struct coord_model_file *f);

/* The header and tensor table of rank @r's weights segment in a group of @n_ranks, a MoE
 * model's experts placed by @experts: shapes, device layout, offsets, h->file_bytes; checksums
 * are filled in by the load. Returns the tensor count, or -EINVAL when the model cannot be split
 * that way, -ENOMEM. @table holds SHLM_MAX_TENSORS. */
int coord_shard_layout(const struct shlm_model *file, int n_ranks, int r, enum seg_experts experts,
                       struct shlm_header *h, struct shlm_tensor *table);

/* A weights segment to fill: coord_shard_layout()'s file_bytes long, created by this process
 * with SEG_LAZY - the load reserves each tensor's memory as it writes it, so the allocation
 * overlaps the reading, and a full tmpfs is an error (-ENOSPC), never SIGBUS. */
struct coord_load_dest {
    int rank;
    struct seg *seg;
};

struct coord_load_stats {
    uint64_t bytes;     /* read from the file */
    uint64_t ns;        /* wall time of the load */
    uint64_t peak_anon; /* the coordinator's RssAnon, sampled as it loads */
    char io[96];        /* how it read: "io_uring O_DIRECT", "io_uring buffered", ... */
};

/* Streams @f into the weights segments of the @n ranks @dest of a group of @n_ranks, as @o's io
 * and chunk say (NULL: the defaults), checking every tensor's checksum; each segment's header is written last, so a segment is complete
 * exactly when its header parses. A long load reports its progress to @log (COORD_LOG_INFO,
 * from the calling thread; NULL: none) and stops at the next tensor once @cancel is set (NULL:
 * never). Returns 0, -ECANCELED, or -errno with @e set (-EIO: a checksum mismatch, a short
 * read, the file changed while it was read). */
int coord_load_shards(struct coord_model_file *f, int n_ranks, const struct coord_load_dest *dest,
                      int n, const struct coord_load_opts *o, const struct coord_log *log,
                      const volatile sig_atomic_t *cancel, struct coord_load_stats *st,
                      struct shardlm_err *e);

#endif
