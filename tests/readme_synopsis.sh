#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's synopses are the usage blocks of the binary's own --help, so that they cannot drift:
# this prints, for `shardlm --help`, every command the main help lists (`shardlm CMD --help`) and
# every `bench` subcommand it lists (`shardlm bench SUB --help`), each help's usage block - its
# first lines, from "usage: " to the first empty line - with "usage: " taken off and continuation
# lines moved left by as much. ctest's test_readme_synopsis compares them with the code block that
# follows "## Commands" in README.md and fails on any difference; --update writes them there.
#   tests/readme_synopsis.sh SHARDLM README.md            check (exit 1 and a diff if they differ)
#   tests/readme_synopsis.sh SHARDLM README.md --update   rewrite the README's block
#   tests/readme_synopsis.sh SHARDLM                      print the synopses
# e.g. after a flag is added: tests/readme_synopsis.sh build/shardlm README.md --update
set -euo pipefail
shopt -s inherit_errexit
if [ $# -lt 1 ] || [ $# -gt 3 ] || { [ $# -eq 3 ] && [ "$3" != --update ]; }; then
    echo "usage: $0 SHARDLM [README.md [--update]]" >&2
    exit 2
fi
bin=$1 readme=${2:-} update=${3:-}

# the usage block of one --help on stdin; a help without one is an error naming the command
usage_block() {
    awk -v cmd="$1" '
        NR == 1 && !/^usage: / {
            printf "readme_synopsis: `%s --help` does not start with \"usage: \"\n", cmd > "/dev/stderr"
            bad = 1
            exit 1
        }
        /^$/ { exit }
        { sub(/^usage: /, ""); sub(/^       /, ""); print }
        END { if (!bad && NR == 0) { printf "readme_synopsis: `%s --help` printed nothing\n", cmd > "/dev/stderr"; exit 1 } }'
}

# The usage block of `shardlm $@ --help`, after checking that it names every option the help
# describes (a line "  -x, --name ..." or "  --name ...": either spelling will do), so that a flag
# added to the option list and not to the usage lines fails here too.
command_synopsis() {
    local help usage line opt found
    help=$("$bin" "$@" --help) || return 1
    usage=$(usage_block "shardlm $*" <<<"$help") || return 1
    while read -r line; do
        found=
        for opt in $line; do
            if grep -qE -- "(^|[^a-zA-Z0-9-])$opt([^a-zA-Z0-9-]|\$)" <<<"$usage"; then
                found=1
            fi
        done
        if [ -z "$found" ]; then
            echo "readme_synopsis: \`shardlm $* --help\` describes $line but its usage lines" \
                "do not name it" >&2
            return 1
        fi
    done < <(grep -oE -- '^  +(-[a-zA-Z0-9], )?--?[a-zA-Z][a-zA-Z0-9-]*' <<<"$help" |
        sed -e 's/^ *//' -e 's/,//')
    printf '%s\n' "$usage"
}

synopses() {
    local main cmd
    main=$("$bin" --help) || return 1
    usage_block "shardlm" <<<"$main" || return 1
    # the commands as the main help lists them ("  NAME  ..."), in its order, each once
    for cmd in $(sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p' <<<"$main" | awk '!seen[$0]++'); do
        command_synopsis "$cmd" || return 1
    done
    for cmd in $(sed -n 's/^  bench \([a-z][a-z]*\) .*/\1/p' <<<"$main" | awk '!seen[$0]++'); do
        command_synopsis bench "$cmd" || return 1
    done
}

want=$(synopses) || exit 1
if [ -z "$readme" ]; then
    printf '%s\n' "$want"
    exit 0
fi

# the README's block: the lines between the first "```sh" after "## Commands" and its "```"
block_range=$(awk '
    /^## Commands$/ { sec = 1; next }
    sec && !start && /^```sh$/ { start = NR + 1; next }
    start && /^```$/ { print start, NR - 1; exit }' "$readme")
if [ -z "$block_range" ]; then
    echo "readme_synopsis: $readme has no \`\`\`sh block after \"## Commands\"" >&2
    exit 1
fi
read -r first last <<<"$block_range"

if [ "$update" = --update ]; then
    tmp=$(mktemp "$readme.XXXXXX")
    trap 'rm -f "$tmp"' EXIT
    {
        head -n $((first - 1)) "$readme"
        printf '%s\n' "$want"
        tail -n +$((last + 1)) "$readme"
    } >"$tmp"
    chmod --reference="$readme" "$tmp"
    mv "$tmp" "$readme"
    trap - EXIT
    echo "readme_synopsis: wrote $(wc -l <<<"$want") lines into $readme"
    exit 0
fi

have=$(sed -n "${first},${last}p" "$readme")
if [ "$have" != "$want" ]; then
    echo "readme_synopsis: the synopses in $readme (lines $first-$last) differ from --help's" \
        "usage lines (< README, > --help):" >&2
    diff <(printf '%s\n' "$have") <(printf '%s\n' "$want") >&2 || true
    echo "readme_synopsis: to update the README: tests/readme_synopsis.sh $bin $readme --update" >&2
    exit 1
fi
echo "readme_synopsis: $(wc -l <<<"$want") lines of $readme equal --help's usage lines"
