#!/usr/bin/env bash
# The device tool carries the tracked files with the bundle, 64 MiB in all: the peregrine bundle
# (~43 MB) and the whole tree (~28 MB) pass it. Benchmark calls need neither of the two largest
# test fixtures, so this moves them out of the tree before such a call and puts them back after.
# usage: scripts/device-hold.sh out | back | status
#   out:    moves them to $PG_HOLD (default /tmp/pg-hold); refuses if something is held already
#   back:   puts them back (run it before any commit or test run: git sees them as deleted)
#   status: what is held
set -euo pipefail
cd "$(dirname "$0")/.."
hold=${PG_HOLD:-/tmp/pg-hold}
# (not tokenizers.tar.xz: device-lib.sh writes random GGUFs with its Llama 3 vocabulary)
paths=(tests/data/quant-tiny tests/data/text-trained/model.safetensors)
case ${1:-status} in
out)
    [[ -e $hold ]] && { echo "$hold exists: run '$0 back' first" >&2; exit 1; }
    for p in "${paths[@]}"; do
        mkdir -p "$hold/$(dirname "$p")"
        mv "$p" "$hold/$p"
    done
    echo "held in $hold: ${paths[*]} (put them back with: $0 back)"
    ;;
back)
    [[ -e $hold ]] || { echo "nothing held in $hold"; exit 0; }
    for p in "${paths[@]}"; do
        [[ -e $hold/$p ]] && mv "$hold/$p" "$p"
    done
    rm -rf "$hold"
    git status --short -- "${paths[@]}"
    echo "back in the tree"
    ;;
status)
    [[ -e $hold ]] && find "$hold" -type f || echo "nothing held"
    ;;
*)
    echo "usage: $0 out | back | status" >&2
    exit 2
    ;;
esac
