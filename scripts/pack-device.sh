#!/usr/bin/env bash
# Packs what a GPU run needs from a build made here into .device/bundle.tar.xz (ignored by git,
# carried by the device tool): the stripped binaries and the non-system shared libraries they
# load (the GPU machine has the CUDA toolkit, not Debian's -dev libraries).
# usage: scripts/pack-device.sh [BUILD_DIR]   (default: build; PG_DEVICE_DIR: where the bundle goes,
#        default .device, added to git's info/exclude; PG_BINS: the binaries,
#        default "peregrine peregrine_cuda_tests": one of them alone where both pass the 64 MiB
#        the device tool carries with the tracked files, e.g. PG_BINS=peregrine_cuda_tests
#        PG_DEVICE_DIR=.device-tests, then PG_BINS=peregrine, each call carrying its folder)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
stage=$(mktemp -d)
dest=${PG_DEVICE_DIR:-.device}
mkdir -p "$stage/pg/lib" "$dest"
bins=(${PG_BINS:-peregrine peregrine_cuda_tests})
for bin in "${bins[@]}"; do
    [[ -x $build/$bin ]] || { echo "missing $build/$bin: build it first" >&2; exit 1; }
    strip -o "$stage/pg/$bin" "$build/$bin"
done
# Libraries outside glibc/libstdc++ and outside CUDA (those come from the GPU machine).
(cd "$build" && ldd "${bins[@]}") | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcublas[^/]*|libcudart)\.so' |
    while read -r lib; do strip -o "$stage/pg/lib/$(basename "$lib")" "$lib" 2>/dev/null || cp "$lib" "$stage/pg/lib/"; done
XZ_OPT="-9 -T2" tar -C "$stage" -cJf "$dest/bundle.tar.xz" pg  # -9: the 64 MiB the device tool carries
rm -rf "$stage"
# The bundle's folder must be ignored, or the device tool carries it with every call.
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
ignored="/${dest#./}/"
[[ $dest == /* ]] || grep -qx "$ignored" "$ex" 2>/dev/null || echo "$ignored" >> "$ex"
ls -l "$dest/bundle.tar.xz"
