/* SPDX-License-Identifier: MIT */
/* kernels/kn_probe.c: CPU probe (CPUID, then OS state through XGETBV) and the choice of one ops
 * table. The caller says which table it wants: nothing here reads the environment. */
#include "kn.h"

#include <cpuid.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <string.h>
#include <unistd.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; granted once per process, asking again is fine */
static bool amx_permitted(void)
{
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

void kn_cpu_probe(struct kn_cpu *c)
{
    unsigned a, b, cx, d;
    memset(c, 0, sizeof(*c));
    if (!__get_cpuid(1, &a, &b, &cx, &d))
        return;
    bool osxsave = cx & (1u << 27);
    bool fma = cx & (1u << 12), f16c = cx & (1u << 29), avx = cx & (1u << 28);
    if (!osxsave || !avx)
        return;
    /* Intel SDM vol. 1, 13.3: XCR0 bits 1,2 = SSE/AVX state; 5,6,7 = opmask, ZMM hi256, hi16 */
    uint64_t xcr0 = xgetbv0();
    bool os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = (xcr0 & 0xe6) == 0xe6;
    bool os_amx = (xcr0 & (3u << 17)) == (3u << 17);
    if (!os_avx)
        return;
    __cpuid_count(7, 0, a, b, cx, d);
    c->fma = fma;
    c->f16c = f16c;
    c->avx2 = b & (1u << 5);
    if (os_avx512) {
        c->avx512f = b & (1u << 16);
        c->avx512bw = b & (1u << 30);
        c->avx512vl = b & (1u << 31);
        c->avx512vnni = cx & (1u << 11);
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        c->avx512bf16 = a1 & (1u << 5);
    }
    /* AMX-BF16, AMX-TILE and AMX-INT8 (CPUID.7.0:EDX bits 22, 24, 25), XCR0 bits 17-18, and Linux's
     * permission for the tile data state (Documentation/arch/x86/xstate.rst): without it the
     * first tile instruction faults. */
    c->amx = os_amx && (d & (1u << 22)) && (d & (1u << 24)) && (d & (1u << 25)) && amx_permitted();
}

#ifdef SHARDLM_HAVE_AVX512
static bool runs_avx512(const struct kn_cpu *c)
{
    return c->avx512f && c->avx512bw && c->avx512vl && c->avx512vnni && c->avx512bf16 && c->fma &&
           c->f16c;
}
#endif

int kn_ops_available(const struct kn_ops **out, int max)
{
    int n = 0;
    if (n < max)
        out[n++] = &kn_ops_ref;
    struct kn_cpu c;
    kn_cpu_probe(&c);
#ifdef SHARDLM_HAVE_AVX2
    if (c.avx2 && c.fma && c.f16c && n < max)
        out[n++] = &kn_ops_avx2;
#endif
#ifdef SHARDLM_HAVE_AVX512
    if (runs_avx512(&c) && n < max)
        out[n++] = &kn_ops_avx512;
#ifdef SHARDLM_HAVE_AMX
    if (runs_avx512(&c) && c.amx && n < max)
        out[n++] = &kn_ops_amx;
#endif
#endif
    return n;
}

static const char *const isa_names[] = {"ref", "avx2", "avx512", "amx"};
static const char *const isa_needs[] = {
    "", "AVX2 and FMA", "AVX-512 F/BW/VL/VNNI/BF16 with OS support (XCR0)",
    "AMX-TILE, AMX-INT8 and AMX-BF16 with OS support (XCR0 and ARCH_REQ_XCOMP_PERM)"};

const struct kn_ops *kn_ops_find(const char *name, char *err, size_t errlen)
{
    const struct kn_ops *all[8];
    int n = kn_ops_available(all, 8);
    for (int i = 0; i < n; i++)
        if (strcmp(all[i]->name, name) == 0)
            return all[i];
    char have[64] = "";
    for (int i = 0; i < n; i++)
        snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s", i ? ", " : "",
                 all[i]->name);
    for (int i = 0; i < (int)(sizeof(isa_names) / sizeof(isa_names[0])); i++)
        if (strcmp(isa_names[i], name) == 0) {
            snprintf(err, errlen,
                     "kernel table %s cannot run here: it needs %s (this machine "
                     "runs %s)",
                     name, isa_needs[i], have);
            return NULL;
        }
    snprintf(err, errlen,
             "unknown kernel table '%s' (tables: ref, avx2, avx512, amx; this "
             "machine runs %s)",
             name, have);
    return NULL;
}

const struct kn_ops *kn_ops_select(const char *want, char *err, size_t errlen)
{
    const struct kn_ops *all[8];
    int n = kn_ops_available(all, 8);
    char why[256];
    if (err && errlen)
        *err = 0;
    if (!want || !*want)
        return all[n - 1];
    const struct kn_ops *o = kn_ops_find(want, why, sizeof(why));
    if (o)
        return o;
    if (err && errlen)
        snprintf(err, errlen, "%s", why);
    return &kn_ops_ref;
}

void kn_cpu_describe(const struct kn_cpu *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s%s%s%s", c->avx2 ? "avx2" : "no avx2", c->avx512f ? " avx512" : "",
             c->avx512vnni ? " avx512-vnni" : "", c->avx512bf16 ? " avx512-bf16" : "",
             c->amx ? " amx" : ", no amx");
}
