/* SPDX-License-Identifier: MIT */
/* coordinator/sched/kvpool.c: the KV block pool and its prefix cache. */
#include "kvpool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int coord_kvpool_init(struct coord_kvpool *p, uint32_t n_blocks, bool prefix_cache)
{
    memset(p, 0, sizeof(*p));
    p->n_blocks = n_blocks;
    p->prefix_cache = prefix_cache;
    uint32_t cap = 16;
    while (cap < 2 * (uint64_t)n_blocks && cap < (1u << 31))
        cap <<= 1;
    p->table_mask = cap - 1;
    p->ref = calloc(n_blocks, sizeof(*p->ref));
    p->hash = calloc(n_blocks, sizeof(*p->hash));
    p->parent = calloc(n_blocks, sizeof(*p->parent));
    p->tokens = malloc((size_t)n_blocks * COORD_KV_BLOCK * sizeof(*p->tokens));
    p->cached = calloc(n_blocks, sizeof(*p->cached));
    p->free_stack = malloc((size_t)n_blocks * sizeof(*p->free_stack));
    p->lru_prev = malloc((size_t)n_blocks * sizeof(*p->lru_prev));
    p->lru_next = malloc((size_t)n_blocks * sizeof(*p->lru_next));
    p->table = malloc((size_t)cap * sizeof(*p->table));
    if (!p->ref || !p->hash || !p->parent || !p->tokens || !p->cached || !p->free_stack ||
        !p->lru_prev || !p->lru_next || !p->table) {
        coord_kvpool_free(p);
        return -ENOMEM;
    }
    /* popped from the top: block 0 first, so a lone sequence's blocks come in order */
    for (uint32_t i = 0; i < n_blocks; i++)
        p->free_stack[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    memset(p->table, 0xff, (size_t)cap * sizeof(*p->table));
    p->lru_head = p->lru_tail = KVPOOL_NONE;
    return 0;
}

void coord_kvpool_free(struct coord_kvpool *p)
{
    free(p->ref);
    free(p->hash);
    free(p->parent);
    free(p->tokens);
    free(p->cached);
    free(p->free_stack);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->table);
    memset(p, 0, sizeof(*p));
}

/* ---- the LRU list of cached blocks nobody holds ---- */

static void lru_push(struct coord_kvpool *p, uint32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = KVPOOL_NONE;
    if (p->lru_tail != KVPOOL_NONE)
        p->lru_next[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

static void lru_remove(struct coord_kvpool *p, uint32_t b)
{
    uint32_t pv = p->lru_prev[b], nx = p->lru_next[b];
    if (pv != KVPOOL_NONE)
        p->lru_next[pv] = nx;
    else
        p->lru_head = nx;
    if (nx != KVPOOL_NONE)
        p->lru_prev[nx] = pv;
    else
        p->lru_tail = pv;
    p->n_lru--;
}

/* ---- the hash table: linear probing, deletion by backward shift ---- */

static uint32_t slot_of(const struct coord_kvpool *p, uint64_t h)
{
    return (uint32_t)(h ^ (h >> 32)) & p->table_mask;
}

static void table_insert(struct coord_kvpool *p, uint32_t b)
{
    uint32_t i = slot_of(p, p->hash[b]);
    while (p->table[i] != KVPOOL_NONE)
        i = (i + 1) & p->table_mask;
    p->table[i] = b;
}

static void table_remove(struct coord_kvpool *p, uint32_t b)
{
    uint32_t i = slot_of(p, p->hash[b]);
    while (p->table[i] != b)
        i = (i + 1) & p->table_mask;
    /* close the gap: move later entries of the run back where a probe would still find them */
    for (uint32_t j = (i + 1) & p->table_mask; p->table[j] != KVPOOL_NONE;
         j = (j + 1) & p->table_mask) {
        uint32_t home = slot_of(p, p->hash[p->table[j]]);
        /* j's entry may fill i when its home is not in (i, j] cyclically */
        bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            p->table[i] = p->table[j];
            i = j;
        }
    }
    p->table[i] = KVPOOL_NONE;
}

static uint32_t table_find(const struct coord_kvpool *p, uint64_t h, uint64_t parent,
                           const int32_t *tokens)
{
    for (uint32_t i = slot_of(p, h); p->table[i] != KVPOOL_NONE; i = (i + 1) & p->table_mask) {
        uint32_t b = p->table[i];
        if (p->hash[b] == h && p->parent[b] == parent &&
            !memcmp(p->tokens + (size_t)b * COORD_KV_BLOCK, tokens,
                    COORD_KV_BLOCK * sizeof(*tokens)))
            return b;
    }
    return KVPOOL_NONE;
}

/* ---- blocks ---- */

uint32_t coord_kvpool_alloc(struct coord_kvpool *p)
{
    uint32_t b;
    if (p->n_free)
        b = p->free_stack[--p->n_free];
    else if (p->n_lru) {
        b = p->lru_head;
        lru_remove(p, b);
        table_remove(p, b);
        p->cached[b] = false;
        p->evictions++;
    } else
        return KVPOOL_NONE;
    p->ref[b] = 1;
    p->n_held++;
    return b;
}

void coord_kvpool_release(struct coord_kvpool *p, uint32_t b)
{
    if (--p->ref[b])
        return;
    p->n_held--;
    if (p->cached[b])
        lru_push(p, b);
    else
        p->free_stack[p->n_free++] = b;
}

uint64_t coord_kvpool_hash(uint64_t parent, const int32_t *tokens)
{
    uint64_t h = parent ^ 0x6a09e667f3bcc909ull;
    for (int i = 0; i < COORD_KV_BLOCK; i++) {
        /* splitmix64's finaliser over the running state and each id */
        h += (uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull;
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
        h ^= h >> 31;
    }
    return h ? h : 1;
}

void coord_kvpool_publish(struct coord_kvpool *p, uint32_t b, uint64_t h, uint64_t parent,
                          const int32_t *tokens)
{
    if (!p->prefix_cache || p->cached[b] || table_find(p, h, parent, tokens) != KVPOOL_NONE)
        return;
    p->hash[b] = h;
    p->parent[b] = parent;
    memcpy(p->tokens + (size_t)b * COORD_KV_BLOCK, tokens, COORD_KV_BLOCK * sizeof(*tokens));
    p->cached[b] = true;
    table_insert(p, b);
}

uint32_t coord_kvpool_lookup(struct coord_kvpool *p, uint64_t h, uint64_t parent,
                             const int32_t *tokens)
{
    if (!p->prefix_cache)
        return KVPOOL_NONE;
    uint32_t b = table_find(p, h, parent, tokens);
    if (b == KVPOOL_NONE)
        return b;
    if (p->ref[b]++ == 0) {
        lru_remove(p, b);
        p->n_held++;
    }
    return b;
}

uint32_t coord_kvpool_find(const struct coord_kvpool *p, uint64_t h, uint64_t parent,
                           const int32_t *tokens)
{
    return table_find(p, h, parent, tokens);
}
