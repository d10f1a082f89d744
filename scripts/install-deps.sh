#!/usr/bin/env bash
# Installs the Debian packages Peregrine's build and tests need. Idempotent: when every
# package is already present it only runs `dpkg-query` and exits.
set -euo pipefail

packages=(
    build-essential cmake ninja-build pkg-config
    nlohmann-json3-dev libcli11-dev libpcre2-dev libicu-dev libxxhash-dev
    libgtest-dev libgmock-dev
    libboost-dev
    # serve --ssl-* (HTTPS, WSS, gRPC over TLS); the TLS test makes its certificates with openssl.
    libssl-dev openssl
    # The chat page's test drives Debian's chromium headless (tests/server/ui.test.mjs).
    chromium
    # KV-cache events over ZMQ (src/server/kv_events.*); the test subscribes with Debian's
    # python3-zmq and decodes with python3-msgpack (tests/server/kv_events_test.py).
    libzmq3-dev python3-zmq python3-msgpack
    # deploy/ tests (tests/deploy): nginx in front of two replicas, the manifests parsed with
    # python3-yaml, compose.yaml checked by docker-compose (no daemon needed for `config`).
    nginx python3-yaml docker-compose
    libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
    xz-utils
    # CI's format check (scripts/ci-format.sh) and fuzzers (scripts/ci-fuzz.sh): Debian 12's
    # clang 14; with --no-install-recommends the compiler-rt runtimes (libFuzzer, ASan, UBSan
    # for clang: libclang_rt.fuzzer-x86_64.a) must be named, and llvm-14 brings llvm-symbolizer
    # for readable sanitizer stacks. (g++'s ASan/UBSan runtimes come with build-essential.)
    clang libclang-rt-14-dev llvm-14 clang-format
    # The multi-host launch test starts `peregrine serve` under Debian's Open MPI `mpirun`
    # (tests/server/parallel.test.mjs); Peregrine itself links no MPI library.
    openmpi-bin
)
# The server tests run node (the official `openai` npm client); any recent nodejs with npm will do.
command -v npm >/dev/null || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
