#!/usr/bin/env bash
# Installs the pinned npm packages of the server tests (package-lock.json) into DEST, once per
# lock file. Fails loudly when npm or the registry cannot be reached: the tests need them.
set -euo pipefail
src="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$1"
dest="$(cd "$1" && pwd)"
stamp="$dest/.lock-installed"
if [ -f "$stamp" ] && cmp -s "$stamp" "$src/package-lock.json" && [ -d "$dest/node_modules/openai" ]; then
    exit 0
fi
if ! command -v npm >/dev/null; then
    echo "server tests: npm is not installed (scripts/install-deps.sh installs it)" >&2
    exit 1
fi
cp "$src/package.json" "$src/package-lock.json" "$dest/"
cd "$dest"
if ! npm ci --no-audit --no-fund --loglevel=error; then
    echo "server tests: 'npm ci' failed (is the npm registry reachable?); the server tests cannot run" >&2
    exit 1
fi
cp "$src/package-lock.json" "$stamp"
