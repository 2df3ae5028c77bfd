#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Writes the man page shardlm(1) from the binary's own help: help2man turns `shardlm --help` and
# `shardlm --version` into the page, and a COMMANDS section holds every command's `--help`
# verbatim (the commands are read off the main help, so a new one joins by itself).
#   cmake/manpage.sh BUILD/shardlm OUT.1
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 SHARDLM OUT.1" >&2; exit 2; }
bin=$1 out=$2
include=$(mktemp)
trap 'rm -f "$include"' EXIT

# roff: a line starting with . or ' is a request, a backslash an escape
verbatim() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }

{
    echo "[COMMANDS]"
    "$bin" --help | sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p' | sort -u | while read -r cmd; do
        echo ".SS $cmd"
        echo ".nf"
        "$bin" "$cmd" --help | verbatim
        echo ".fi"
    done
    for sub in allreduce kernels tokenizer sampler; do
        echo ".SS bench $sub"
        echo ".nf"
        "$bin" bench "$sub" --help | verbatim
        echo ".fi"
    done
    cat <<'ROFF'
[FILES]
.TP
.I /usr/libexec/shardlm/shardlm-worker
the worker process the coordinator starts (one per NUMA node)
.TP
.I /dev/shm/shardlm-<uid>/
the runtime directory: weights and KV segments, sockets (SHARDLM_RUNTIME_DIR)
.TP
.I /usr/share/shardlm/
the bundled stories260K model, for a first run
.TP
.I /etc/shardlm/<instance>.conf
a served model's settings, read by the systemd unit shardlm@<instance>.service
[SEE ALSO]
The operator's guide, /usr/share/doc/shardlm/deploy.md (docs/deploy.md in the source).
ROFF
} > "$include"

help2man --no-info --no-discard-stderr --section=1 --source="shardlm" \
    --name="serve language models on CPU servers from 4-bit weights" \
    --include="$include" --output="$out" "$bin"
