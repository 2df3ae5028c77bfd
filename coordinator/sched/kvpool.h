/* SPDX-License-Identifier: MIT */
/* coordinator/sched/kvpool.h: the KV cache's blocks as the scheduler hands them out - reference
 * counts, a free list, and the prefix cache over full blocks. */

/* Every rank's KV segment is the same pool of n_blocks blocks of COORD_KV_BLOCK positions (shm/
 * seg.h); this is the one place that decides which block holds what. A block is in one of
 * three states:
 *   free     no sequence holds it and it caches nothing;
 *   held     ref > 0 sequences hold it in their block tables (only a full, cached block is ever
 *            held by more than one);
 *   cached   ref == 0 but it holds a full block of some prefix, findable by that prefix's hash:
 *            kept on an LRU list and taken (evicted) only when no free block is left.
 * A full block's identity is a hash chained over its parent block's hash and its own token
 * ids; a lookup compares the stored tokens and parent hash too, so a hash collision never maps
 * wrong KV. Not thread-safe: the scheduler's thread owns it.
 */
#ifndef SHARDLM_COORD_KVPOOL_H
#define SHARDLM_COORD_KVPOOL_H

#include "engine.h"

#include <stdbool.h>
#include <stdint.h>

#define KVPOOL_NONE UINT32_MAX

struct coord_kvpool {
    uint32_t n_blocks;
    bool prefix_cache;
    uint32_t *ref;        /* (n_blocks) sequences holding the block */
    uint64_t *hash;       /* (n_blocks) a cached block's chained hash (valid when cached[]) */
    uint64_t *parent;     /* (n_blocks) its parent's hash (0 for a first block) */
    int32_t *tokens;      /* (n_blocks, COORD_KV_BLOCK) a cached block's token ids */
    bool *cached;         /* (n_blocks) findable by hash */
    uint32_t *free_stack; /* free blocks */
    uint32_t n_free;
    uint32_t *lru_prev, *lru_next; /* cached blocks with ref 0, least recently used first */
    uint32_t lru_head, lru_tail, n_lru;
    uint32_t *table; /* open-addressing hash table of cached blocks (KVPOOL_NONE: empty) */
    uint32_t table_mask;
    uint32_t n_held; /* blocks with ref > 0 */
    uint64_t evictions;
};

/* A pool of @n_blocks blocks, all free. Returns 0 or -ENOMEM. */
int coord_kvpool_init(struct coord_kvpool *p, uint32_t n_blocks, bool prefix_cache);
void coord_kvpool_free(struct coord_kvpool *p);

/* Blocks a new allocation can take: free ones and cached ones nobody holds. */
static inline uint32_t coord_kvpool_available(const struct coord_kvpool *p)
{
    return p->n_free + p->n_lru;
}

/* Takes a block for one holder: a free one, else the least recently used cached one (its
 * cache entry dropped). Returns the block or KVPOOL_NONE when every block is held. */
uint32_t coord_kvpool_alloc(struct coord_kvpool *p);
/* Drops one holder of block @b; with none left it is cached (LRU, most recent) or free. */
void coord_kvpool_release(struct coord_kvpool *p, uint32_t b);

/* The chained hash of a full block of @tokens (COORD_KV_BLOCK ids) after a block of hash
 * @parent (0 for the first block of a sequence). Never 0. */
uint64_t coord_kvpool_hash(uint64_t parent, const int32_t *tokens);
/* Block @b, held, now holds the full block @tokens after @parent with hash @h: makes it
 * findable (unless prefix caching is off or another block already caches that prefix). */
void coord_kvpool_publish(struct coord_kvpool *p, uint32_t b, uint64_t h, uint64_t parent,
                          const int32_t *tokens);
/* The cached block of hash @h holding @tokens after @parent, taken for one more holder; or
 * KVPOOL_NONE. */
uint32_t coord_kvpool_lookup(struct coord_kvpool *p, uint64_t h, uint64_t parent,
                             const int32_t *tokens);
/* The cached block of that prefix without taking it (audits), or KVPOOL_NONE. */
uint32_t coord_kvpool_find(const struct coord_kvpool *p, uint64_t h, uint64_t parent,
                           const int32_t *tokens);

#endif
