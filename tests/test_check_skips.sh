#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/check_skips.sh on hand-made JUnit reports: a hardware skip for a flag no CPU has passes;
# a cmocka skip without a reason, a ctest skip (exit 77) without one, and a "hardware" skip for a
# flag this CPU has (fpu) fail.
set -euo pipefail
check=$(dirname "$0")/check_skips.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# report NAME STATUS OUTPUT: a one-test report in $dir/NAME.xml
report() {
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="x" tests="1">\n' >"$dir/$1.xml"
  printf '\t<testcase name="%s" classname="%s" time="1" status="%s">\n' "$1" "$1" "$2" \
    >>"$dir/$1.xml"
  printf '\t\t<system-out>%s\n</system-out>\n\t</testcase>\n</testsuite>\n' "$3" >>"$dir/$1.xml"
}
cmocka_skip() { # one skipped case, with the line $1 before it
  printf '[ RUN      ] t1\n%s\n[  SKIPPED ] t1\n[ RUN      ] t2\n[       OK ] t2\n' "$1"
  printf '[==========] 2 test(s) run.\n[  PASSED  ] 1 test(s).\n'
  printf '[  SKIPPED ] 1 test(s), listed below:\n[  SKIPPED ] t1'
}
report hw run "$(cmocka_skip '[  SKIP    ] hardware fpu,no_such_flag: no such table here')"
report plain run "$(cmocka_skip '[  SKIP    ] cannot mount a tmpfs')"
report has_flag run "$(cmocka_skip '[  SKIP    ] hardware fpu: no fpu table')"
report exit77 notrun 'SKIP: shared test data not found'
report exit77_hw notrun '[  SKIP    ] hardware no_such_flag: needs it'
report passed run '[==========] 1 test(s) run.'

fails=0
expect() { # expect RC NAME
  local rc=0
  "$check" "$dir/$2.xml" >"$dir/$2.out" 2>&1 || rc=$?
  if [ "$rc" -ne "$1" ]; then
    echo "FAIL: $2: check_skips exited $rc, want $1; it said: $(cat "$dir/$2.out")"
    fails=$((fails + 1))
  else
    echo "ok: $2 -> $rc: $(head -1 "$dir/$2.out")"
  fi
}
expect 0 hw
expect 1 plain
expect 1 has_flag
expect 1 exit77
expect 0 exit77_hw
expect 0 passed
echo "$((6 - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
