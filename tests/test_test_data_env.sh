#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ctest's test_test_data_env: SHARDLM_TEST_DATA in the environment wins over the CMake cache's
# -DSHARDLM_TEST_DATA under ctest (tests/CMakeLists.txt passes the cache as
# SHARDLM_TEST_DATA_DEFAULT). Runs ctest on BUILD_DIR with SHARDLM_TEST_DATA set to an empty copy:
# test_data (sh), test_tokenizer (tests/testutil.h) and test_chat_templates (bash) must each fail
# naming that folder; then with SHARDLM_TEST_DATA set to a link to the cache's folder, test_data
# must pass (so the failures above are about the folder, not about running ctest here).
#   tests/test_test_data_env.sh BUILD_DIR      (ctest: $CTEST, default ctest)
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(realpath -e "$1")
ctest=${CTEST:-ctest}
cache_data=$(sed -n 's/^SHARDLM_TEST_DATA:PATH=//p' "$build/CMakeCache.txt")
[ -d "$cache_data" ] || { echo "test_test_data_env: no SHARDLM_TEST_DATA folder in $build/CMakeCache.txt" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/empty"
echo "0000000000000000000000000000000000000000000000000000000000000000  golden/stories260K/greedy.tsv" \
    >"$tmp/empty/SHA256SUMS"
ln -s "$cache_data" "$tmp/good"
# ctest over the build's tests from a folder of its own, so that this ctest's Testing/ logs do not
# overwrite those of the ctest running this test
mkdir "$tmp/ctest"
echo "include(\"$build/tests/CTestTestfile.cmake\")" >"$tmp/ctest/CTestTestfile.cmake"

fail=0
# one test under ctest with SHARDLM_TEST_DATA=$1; its output in $tmp/out
run() {
    SHARDLM_TEST_DATA=$1 "$ctest" --test-dir "$tmp/ctest" -R "^$2\$" --output-on-failure \
        >"$tmp/out" 2>&1
}
for t in test_data test_tokenizer test_chat_templates; do
    if run "$tmp/empty" "$t"; then
        echo "FAIL: $t passed with SHARDLM_TEST_DATA=$tmp/empty: the cache's folder was used" >&2
        fail=1
    elif [ "$t" != test_data ] && ! grep -q "$tmp/empty" "$tmp/out"; then
        echo "FAIL: $t failed without naming SHARDLM_TEST_DATA's folder $tmp/empty:" >&2
        tail -n 20 "$tmp/out" >&2
        fail=1
    elif ! grep -q "tests passed, 1 tests failed out of 1" "$tmp/out"; then
        echo "FAIL: ctest did not run $t:" >&2
        tail -n 20 "$tmp/out" >&2
        fail=1
    else
        echo "ok: $t fails with SHARDLM_TEST_DATA=$tmp/empty"
    fi
done
if ! run "$tmp/good" test_data; then
    echo "FAIL: test_data failed with SHARDLM_TEST_DATA=$tmp/good (a link to $cache_data):" >&2
    tail -n 20 "$tmp/out" >&2
    fail=1
else
    echo "ok: test_data passes with SHARDLM_TEST_DATA=$tmp/good"
fi
exit $fail
