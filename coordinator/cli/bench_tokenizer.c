/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench_tokenizer.c: `shardlm bench tokenizer` - the encoding speed of a tokenizer
 * on English text made here, the same bytes every time, so that every vocabulary is timed on one
 * input. */
#include "bench.h"

#include "tokenizer.h"
#include "cli.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const char usage_bench_tokenizer[] =
    "usage: shardlm bench tokenizer --tokenizer FILE [--mb N] [-r REPS]\n"
    "\n"
    "Encodes about N MB (10^6 bytes) of English text, made here the same way every time (varied\n"
    "sentences in paragraphs), in one call, REPS times, and prints one line:\n"
    "  tokenizer <file> bytes=<n> tokens=<n> mb_per_s=<x> reps=<r>\n"
    "the median speed over the repetitions. FILE is any source `shardlm tokenize` reads: a .shlm\n"
    "model, a GGUF file, a tokenizer.json, a tokenizer blob or a llama2.c tokenizer.bin.\n"
    "  --tokenizer FILE  the tokenizer (required)\n"
    "  --mb N            megabytes of text, 0.001..512 (default 1)\n"
    "  -r, --reps R      repetitions, median reported (default 3)\n";

#define MAX_REPS 100
/* The encoder takes at most UINT32_MAX / 8 bytes in one call (536.8 MB; past it -E2BIG): the
 * range of --mb stays within it. Its memory is bounded too: the text, one id per byte at most
 * (4 bytes each) and the encoder's own, under 4 GB at 512. */
#define MAX_MB 512

static const char *const subjects[] = {
    "the old fisherman", "a little girl", "my brother", "the teacher", "Tom", "Lily",
    "the small dog", "our neighbour", "the captain", "everyone in the village", "the baker",
    "a tired traveller", "the children", "her grandmother", "the king's soldiers", "Max",
};
static const char *const verbs[] = {
    "walked to", "looked at", "painted", "found", "carried", "forgot about", "talked about",
    "ran past", "cleaned", "wanted to visit", "dreamed of", "built", "sold", "laughed at",
    "waited near", "wrote a letter about",
};
static const char *const adjectives[] = {
    "quiet", "bright", "muddy", "enormous", "tiny", "broken", "shiny", "ancient", "friendly",
    "crowded", "cold", "beautiful", "strange", "yellow", "empty", "famous",
};
static const char *const objects[] = {
    "harbor", "garden", "bicycle", "library", "mountain", "kitchen", "boat", "castle", "market",
    "forest", "bridge", "school", "river", "window", "station", "tree house",
};
static const char *const tails[] = {
    "", " before the sun went down", " because it was raining", " with a big smile",
    " after lunch", " and nobody knew why", " on a Tuesday morning", " for the third time",
    ", which surprised everyone", " while the birds were singing", " without saying a word",
    " as fast as possible",
};
/* made-up names and numbers: a long tail of words, as real text has */
static const char *const syllables[] = {
    "ka", "lo", "mi", "ren", "tas", "vel", "dor", "ish", "an", "bel", "cor", "fen",
    "gal", "hu", "jor", "mar", "nel", "pra", "quin", "sol", "tor", "ul", "wen", "zar",
};
static const char *const says[] = {
    "\"I can't believe it,\" said ", "\"Where are we going?\" asked ",
    "\"That's wonderful!\" cried ", "\"Let's try again tomorrow,\" said ",
};

static uint64_t text_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

#define PICK(s, a) ((a)[text_rng(s) % (sizeof(a) / sizeof((a)[0]))])

/* One sentence, capitalized, with its trailing space or paragraph break, into @o (room for 512
 * bytes); returns its length. The picks are made in turn: argument order is unspecified. */
static size_t text_sentence(char *o, uint64_t *s)
{
    char name[32], num[48];
    const char *who = PICK(s, subjects), *verb = PICK(s, verbs), *adj = PICK(s, adjectives);
    const char *obj = PICK(s, objects), *tail = PICK(s, tails), *say = PICK(s, says);
    const char *a = PICK(s, syllables), *b = PICK(s, syllables), *c = PICK(s, syllables);
    snprintf(name, sizeof(name), "%c%s%s%s", a[0] - 'a' + 'A', a + 1, b, text_rng(s) % 2 ? c : "");
    unsigned x = (unsigned)(text_rng(s) % 3000), y = (unsigned)(text_rng(s) % 60);
    switch (text_rng(s) % 4) {
    case 0:
        snprintf(num, sizeof(num), " in %u", 1000 + x);
        break;
    case 1:
        snprintf(num, sizeof(num), " at %u:%02u", 1 + x % 12, y);
        break;
    default:
        snprintf(num, sizeof(num), " for %u minutes", 2 + x % 98);
        break;
    }
    if (text_rng(s) % 3 == 0)
        who = name;
    if (text_rng(s) % 4 == 0)
        tail = num;
    int n, kind = (int)(text_rng(s) % 6);
    if (kind == 0)
        n = snprintf(o, 512, "%s%s.", say, who);
    else if (kind == 1)
        n = snprintf(o, 512, "Did %s really see the %s %s?", who, adj, obj);
    else
        n = snprintf(o, 512, "%s %s the %s %s%s.", who, verb, adj, obj, tail);
    char *first = o[0] == '"' ? o + 1 : o;
    if (*first >= 'a' && *first <= 'z')
        *first = (char)(*first - 'a' + 'A');
    const char *gap = text_rng(s) % 6 ? " " : "\n\n";
    memcpy(o + n, gap, strlen(gap) + 1);
    return (size_t)n + strlen(gap);
}

void coord_bench_text(char *buf, size_t n)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    char line[512];
    size_t o = 0;
    while (o < n) {
        size_t l = text_sentence(line, &s);
        if (l > n - o)
            l = n - o;
        memcpy(buf + o, line, l);
        o += l;
    }
    buf[n] = 0;
}

/* Times @reps encodings of @text (@n bytes) into @ids (@max); *@mb_per_s gets the median.
 * Returns the token count or -errno. */
static int bench_encode(const struct coord_tok *t, const char *text, size_t n, int32_t *ids,
                        int max, int reps, double *mb_per_s)
{
    double rate[MAX_REPS];
    int count = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = shardlm_now_ns();
        count = coord_tok_encode_ex(t, text, n, 0, ids, max);
        uint64_t ns = shardlm_now_ns() - t0;
        if (count < 0)
            return count;
        rate[r] = (double)n / 1e6 / ((double)(ns ? ns : 1) / 1e9);
    }
    *mb_per_s = coord_sort_median(rate, reps);
    return count;
}

int coord_bench_tokenizer(int argc, char **argv)
{
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"mb", required_argument, 0, 'm'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *path = NULL;
    double mb = 1;
    static const struct coord_cli_path paths[] = {{'t', "--tokenizer"}, {0, 0}};
    static const struct coord_cli_cmd cmd = {"bench tokenizer", usage_bench_tokenizer, ":r:h", opts,
                                             paths};
    int reps = 3, c, rc;
    long v;
    optind = 0; /* glibc: start afresh, whatever parsed argv before */
    opterr = 0;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 't':
            path = optarg;
            break;
        case 'm':
            if (!coord_cli_parse_double(optarg, 0.001, MAX_MB, &mb))
                return coord_usage_error("bench tokenizer", usage_bench_tokenizer,
                                         "--mb '%s': expected 0.001..%d", optarg, MAX_MB);
            break;
        case 'r':
            if (!coord_parse_long(optarg, 1, MAX_REPS, &v))
                return coord_usage_error("bench tokenizer", usage_bench_tokenizer,
                                         "-r '%s': expected 1..100 repetitions", optarg);
            reps = (int)v;
            break;
        case ':':
            return coord_usage_error("bench tokenizer", usage_bench_tokenizer,
                                     "option '%s' needs a value", argv[optind - 1]);
        default:
            return coord_usage_error("bench tokenizer", usage_bench_tokenizer, "bad option '%s'",
                                     argv[optind - 1]);
        }
    }
    if (optind != argc)
        return coord_usage_error("bench tokenizer", usage_bench_tokenizer,
                                 "unexpected argument '%s'", argv[optind]);
    if (!path)
        return coord_usage_error("bench tokenizer", usage_bench_tokenizer, "%s",
                                 "--tokenizer FILE is required");

    struct shardlm_err e;
    struct coord_tok t;
    void *map;
    size_t size;
    if (coord_cli_open_tok(path, 0, &t, &map, &size, &e)) {
        fprintf(stderr, "shardlm bench tokenizer: %s\n", e.msg);
        return 1;
    }
    size_t n = (size_t)(mb * 1e6);
    int max = (int)n + 16; /* at most one id per byte, plus BOS/EOS */
    char *text = malloc(n + 1);
    int32_t *ids = malloc((size_t)max * sizeof(int32_t));
    double rate = 0;
    int count = -ENOMEM;
    if (text && ids) {
        coord_bench_text(text, n);
        count = bench_encode(&t, text, n, ids, max, reps, &rate);
    }
    if (count < 0)
        fprintf(stderr, "shardlm bench tokenizer: %s: cannot tokenize the text: %s\n", path,
                strerror(-count));
    else
        printf("tokenizer %s bytes=%zu tokens=%d mb_per_s=%.3f reps=%d\n", path, n, count, rate,
               reps);
    free(ids);
    free(text);
    coord_tok_free(&t);
    munmap(map, size);
    return count < 0 ? 1 : 0;
}
