#!/usr/bin/env bash
# Fails when a source file includes a header of a layer above its own. The layers, lowest
# first: each may include itself and the layers after its colon. `public` is include/peregrine,
# the library's API and its plain request/response types (public headers include only each
# other). docs/ARCHITECTURE.md draws the same graph.
#
#   core          : -
#   formats       : core
#   dist          : core                        (collectives, launch, rendezvous)
#   grammar       : core                        (structured output: grammars, matcher, token masks)
#   tokenizer     : core formats
#   template      : core formats tokenizer
#   backend       : core dist public                 (src/backend/*.h: the device and ops contract)
#   backend/cpu   : core dist backend public
#   backend/cuda  : core dist backend public
#   model         : core formats dist backend public
#   worker        : core formats dist backend backend/cpu backend/cuda model public
#   engine        : core formats tokenizer grammar dist backend model worker public
#   server        : core formats tokenizer template grammar backend model worker engine public
#   cli, bench    : everything
#
# Run by the build (target check_layers, which every library depends on) and by ctest.
# usage: scripts/check-layers.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

allowed() {  # layer -> the include prefixes it may use
    case $1 in
        core) echo "core" ;;
        formats) echo "core formats" ;;
        dist) echo "core dist" ;;
        grammar) echo "core grammar" ;;
        tokenizer) echo "core formats tokenizer" ;;
        template) echo "core formats tokenizer template" ;;
        backend) echo "core dist backend peregrine" ;;
        backend/cpu) echo "core dist backend backend/cpu peregrine" ;;
        backend/cuda) echo "core dist backend backend/cuda peregrine" ;;
        model) echo "core formats dist backend model peregrine" ;;
        worker) echo "core formats dist backend backend/cpu backend/cuda model worker peregrine" ;;
        engine) echo "core formats tokenizer grammar dist backend model worker engine peregrine" ;;
        server) echo "core formats tokenizer template grammar dist backend model worker engine server peregrine" ;;
        router) echo "core server router" ;;
        public) echo "peregrine" ;;
        *) echo "*" ;;
    esac
}

layer_of() {  # a file's layer from its path
    case $1 in
        include/peregrine/*) echo public ;;
        src/backend/cpu/*) echo backend/cpu ;;
        src/backend/cuda/*) echo backend/cuda ;;
        src/backend/*) echo backend ;;
        src/*/*) local d=${1#src/}; echo "${d%%/*}" ;;
        *) echo other ;;
    esac
}

# The layer a quoted include names: "backend/cuda/x.h" -> backend/cuda, "engine/x.h" -> engine.
target_of() {
    case $1 in
        backend/cpu/*) echo backend/cpu ;;
        backend/cuda/*) echo backend/cuda ;;
        */*) echo "${1%%/*}" ;;
        *) echo "" ;;  # same-folder include
    esac
}

bad=0
while IFS= read -r file; do
    layer=$(layer_of "$file")
    ok=$(allowed "$layer")
    [[ $ok == "*" ]] && continue
    while IFS= read -r inc; do
        t=$(target_of "$inc")
        [[ -z $t ]] && continue
        case " $ok " in
            *" $t "*) ;;
            *)
                echo "$file: includes \"$inc\" ($t), above its layer ($layer may use: $ok)" >&2
                bad=1
                ;;
        esac
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find src include -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) | sort)
if [[ $bad -ne 0 ]]; then
    echo "layering violated: see the layers at the top of scripts/check-layers.sh" >&2
    exit 1
fi
echo "layers ok"
