#!/usr/bin/env bash
# CI: clang-format check (the repository's .clang-format) of the C++/CUDA files the latest commit
# changed and that still exist. Nothing to check when HEAD has no parent. Fails, listing the
# offending lines, when a file is not formatted; `make format` (or clang-format -i FILE) fixes it.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! git rev-parse --verify --quiet HEAD~1 >/dev/null; then
    echo "ci-format: HEAD has no parent commit; nothing to check"
    exit 0
fi

files=()
while IFS= read -r -d '' f; do
    [ -f "$f" ] && files+=("$f")
done < <(git diff -z --name-only --diff-filter=d HEAD~1 HEAD -- '*.cc' '*.h' '*.cu' '*.cuh')

if [ ${#files[@]} -eq 0 ]; then
    echo "ci-format: the latest commit changes no .cc/.h/.cu/.cuh file"
    exit 0
fi
echo "ci-format: clang-format $(clang-format --version | grep -o 'version [0-9.]*'), ${#files[@]} file(s)"
status=0
clang-format --style=file --dry-run --Werror "${files[@]}" || status=$?
if [ "$status" -ne 0 ]; then
    echo "ci-format: FAILED: run 'clang-format -i' on the files above" >&2
    exit 1
fi
echo "ci-format: ${#files[@]} file(s) formatted"
