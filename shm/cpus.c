/* SPDX-License-Identifier: MIT */
/* shm/cpus.c: parsing and formatting CPU lists. */
#include "cpus.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

/* Reads the CPU number at s[*i..len) into *@cpu and moves *@i past it: decimal digits only
 * (strtol's blanks and signs are not a CPU), none read past @len, below SEG_MAX_CPUS. */
static bool cpu_number(const char *s, size_t len, size_t *i, int *cpu)
{
    size_t j = *i;
    int v = 0;
    for (; j < len && s[j] >= '0' && s[j] <= '9'; j++) {
        v = v * 10 + (s[j] - '0');
        if (v >= SEG_MAX_CPUS)
            return false;
    }
    if (j == *i)
        return false;
    *i = j;
    *cpu = v;
    return true;
}

int seg_cpulist_parse(const char *s, size_t len, int *out, int max)
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        int a, b;
        if (!cpu_number(s, len, &i, &a))
            return -EINVAL;
        b = a;
        if (i < len && s[i] == '-') {
            i++;
            if (!cpu_number(s, len, &i, &b) || b < a)
                return -EINVAL;
        }
        for (int c = a; c <= b; c++) {
            for (int k = 0; k < n; k++)
                if (out[k] == c)
                    return -EEXIST; /* listed twice */
            if (n >= max)
                return -EINVAL;
            out[n++] = c;
        }
        if (i < len) {
            if (s[i] != ',')
                return -EINVAL;
            i++;
            if (i == len)
                return -EINVAL;
        }
    }
    return n ? n : -EINVAL;
}

void seg_cpulist_format(const int *cpus, int n, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < n && used < len;) {
        int j = i;
        while (j + 1 < n && cpus[j + 1] == cpus[j] + 1)
            j++;
        int w = j > i ? snprintf(out + used, len - used, "%s%d-%d", i ? "," : "", cpus[i], cpus[j])
                      : snprintf(out + used, len - used, "%s%d", i ? "," : "", cpus[i]);
        used += (size_t)(w > 0 ? w : 0);
        i = j + 1;
    }
}
