#!/usr/bin/env bash
# scripts/check-layers.sh passes on the repository and fails on a tree where the backend
# includes the engine (and where the engine includes the server).
set -euo pipefail
repo=$1
"$repo/scripts/check-layers.sh" "$repo"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/backend" "$tmp/src/engine" "$tmp/include/peregrine"
printf '#include "core/tensor.h"\n#include "engine/sequence.h"\n' > "$tmp/src/backend/bad.h"
if "$repo/scripts/check-layers.sh" "$tmp" 2> "$tmp/err"; then
    echo "FAIL: an include of src/engine from src/backend passed" >&2
    exit 1
fi
grep -q 'src/backend/bad.h: includes "engine/sequence.h"' "$tmp/err"
rm "$tmp/src/backend/bad.h"
printf '#include "server/http/exchange.h"\n' > "$tmp/src/engine/bad.cc"
if "$repo/scripts/check-layers.sh" "$tmp" 2> "$tmp/err"; then
    echo "FAIL: an include of src/server from src/engine passed" >&2
    exit 1
fi
echo "check-layers refuses upward includes"
