#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fails unless every test in a ctest JUnit report ran, but for hardware this CPU lacks. A skip is
# for hardware when the test printed `[  SKIP    ] hardware FLAGS: why` (tu_skip_hardware in
# tests/testutil.h) for it, with FLAGS (comma-separated /proc/cpuinfo flags) not all present here.
# Counts both ctest's skips (exit 77) and cmocka's skipped cases inside a test.
#
#   ctest --test-dir build --output-junit "$PWD/junit.xml"; tests/check_skips.sh junit.xml
#
# Prints one line per test that skipped anything and exits 1 if any skip is not for hardware.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 JUNIT.xml" >&2; exit 2; }
[ -s "$1" ] || { echo "check_skips: no JUnit report at $1" >&2; exit 1; }
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)

awk -v cpu_flags="$cpu_flags" '
BEGIN {
    n = split(cpu_flags, f, " ")
    for (i = 1; i <= n; i++) have[f[i]] = 1
    bad = 0; tests = 0
}
# one <testcase> element: its name, ctest status and output
/<testcase / {
    name = $0; sub(/.*<testcase name="/, "", name); sub(/".*/, "", name)
    status = $0; sub(/.*status="/, "", status); sub(/".*/, "", status)
    skipped = (status == "notrun" || status == "disabled") ? 1 : 0
    hw = 0; not_hw = ""; flags_seen = ""; tests++
}
# cmocka: "[  SKIPPED ] 3 test(s), listed below:" closes a group that skipped 3 cases
/\[  SKIPPED \] [0-9]+ test\(s\)/ {
    s = $0; sub(/.*\[  SKIPPED \] /, "", s); sub(/ .*/, "", s); skipped += s
}
/\[  SKIP    \] hardware [a-z0-9_,]*:/ {
    fl = $0; sub(/.*\[  SKIP    \] hardware /, "", fl); sub(/:.*/, "", fl)
    m = split(fl, need, ","); lacks = 0
    for (i = 1; i <= m; i++) if (!(need[i] in have)) lacks = 1
    if (m > 0 && lacks) {
        hw++
        if (index(" " flags_seen " ", " " fl " ") == 0) flags_seen = flags_seen " " fl
    } else {
        not_hw = not_hw " (this CPU has " fl ")"
    }
}
/<\/testcase>/ {
    if (status == "disabled" || (status == "notrun" && hw == 0 && not_hw == "")) {
        printf "check_skips: %s did not run (%s) and gave no hardware reason\n", name, status
        bad = 1
    } else if (skipped > hw) {
        printf "check_skips: %s skipped %d case(s), %d of them for hardware this CPU lacks%s\n",
            name, skipped, hw, not_hw
        bad = 1
    } else if (skipped > 0) {
        printf "check_skips: %s skipped %d case(s) for hardware this CPU lacks:%s\n", name, skipped,
            flags_seen
    }
}
END {
    if (tests == 0) { print "check_skips: the report holds no test"; exit 1 }
    exit bad
}' "$1"
