#!/usr/bin/python3
"""Static checks of deploy/docker/Dockerfile.* (building them needs a registry, not here):
  - a builder stage and a runtime stage; the runtime stage EXPOSEs 8000 and its ENTRYPOINT is
    ["peregrine"] (exec form, so signals reach the server and it can drain);
  - every COPY from the build context names a path of the repository that the Dockerfile's
    own .dockerignore does not exclude, and every path the runtime copies from the builder is
    one the builder wrote or copied;
  - the Debian packages the builder installs are all in scripts/install-deps.sh (one list of
    build dependencies; a package renamed there shows up here);
  - the CMake configuration the builder runs turns tests off and builds only `peregrine`.
A self-check feeds a Dockerfile with a COPY of a missing path and a package install-deps.sh
lacks, and fails unless both are reported.

usage: dockerfiles_test.py [REPO_ROOT]"""
import fnmatch
import json
import os
import re
import shlex
import sys


def instructions(text):
    out, cur = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        cur += raw
        if cur.strip():
            word, _, rest = cur.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def deps_packages(root):
    """The package names in scripts/install-deps.sh's packages=( ... ) and packages+=( ... )."""
    with open(os.path.join(root, "scripts", "install-deps.sh")) as f:
        text = "\n".join(re.sub(r"(^|\s)#.*", "", line) for line in f)  # comments hold parentheses
    names = set()
    for block in re.findall(r"packages\+?=\((.*?)\)", text, re.S):
        names.update(block.split())
    return names


def ignored(path, patterns):
    hit = False
    for p in patterns:
        neg = p.startswith("!")
        p = p[1:] if neg else p
        p = p.lstrip("/")
        if fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p):
            hit = not neg
    return hit


def check_dockerfile(name, text, root, deps, ignore, errors):
    stages = []  # [{"name", "from", "ins": [(ins, arg)]}]
    for ins, arg in instructions(text):
        if ins == "FROM":
            words = arg.split()
            stages.append({"name": words[2] if len(words) > 2 and words[1].upper() == "AS" else None,
                           "from": words[0], "ins": []})
        elif stages:
            stages[-1]["ins"].append((ins, arg))
    if len(stages) < 2:
        errors.append(f"{name}: expected a builder and a runtime stage, found {len(stages)} stage(s)")
        return
    names = {s["name"] for s in stages if s["name"]}
    final = stages[-1]
    final_ins = dict((i, a) for i, a in final["ins"])
    if "8000" not in final_ins.get("EXPOSE", "").split():
        errors.append(f"{name}: the runtime stage does not EXPOSE 8000")
    try:
        entry = json.loads(final_ins.get("ENTRYPOINT", "null"))
    except ValueError:
        entry = None
    if entry != ["peregrine"]:
        errors.append(f"{name}: the runtime ENTRYPOINT is {final_ins.get('ENTRYPOINT')!r}, expected [\"peregrine\"]")

    written = {}  # stage name -> absolute paths it creates (WORKDIR-relative COPY targets, build outputs)
    for s in stages:
        workdir = "/"
        paths = written.setdefault(s["name"], set())
        for ins, arg in s["ins"]:
            if ins == "WORKDIR":
                workdir = os.path.join(workdir, arg)
            elif ins == "COPY":
                words = shlex.split(arg)
                opts = [w for w in words if w.startswith("--")]
                srcs, dest_raw = [w for w in words if not w.startswith("--")][:-1], words[-1]
                dest = os.path.normpath(os.path.join(workdir, dest_raw))
                src_stage = next((o.split("=", 1)[1] for o in opts if o.startswith("--from=")), None)
                for src in srcs:
                    if src_stage is None:
                        rel = os.path.normpath(src)
                        if not os.path.exists(os.path.join(root, rel)):
                            errors.append(f"{name}: COPY {src}: no such path in the repository")
                        elif ignored(rel, ignore):
                            errors.append(f"{name}: COPY {src}: excluded by {name}.dockerignore")
                    else:
                        if src_stage not in names:
                            errors.append(f"{name}: COPY --from={src_stage}: no such stage")
                        elif not any(src.rstrip("/") == p or src.startswith(p + "/") for p in written.get(src_stage, ())):
                            errors.append(f"{name}: COPY --from={src_stage} {src}: not written by that stage")
                    # A directory's contents land in dest; a file in dest, or dest/<name> when dest
                    # is a directory.
                    is_dir = src.endswith("/") or (src_stage is None and os.path.isdir(os.path.join(root, src)))
                    if is_dir or (len(srcs) == 1 and not dest_raw.endswith("/") and dest_raw != "."):
                        paths.add(dest)
                    else:
                        paths.add(os.path.normpath(os.path.join(dest, os.path.basename(src))))
            elif ins == "RUN":
                for m in re.finditer(r"(?:-B\s+|>\s*)(\S+)", arg):
                    paths.add(os.path.normpath(os.path.join(workdir, m.group(1))))
                if "apt-get install" in arg and s is not final:
                    pkgs = [w for w in arg.split("apt-get install", 1)[1].split("&&")[0].split()
                            if not w.startswith("-") and not w.startswith("$")]
                    for p in pkgs:
                        if p not in deps:
                            errors.append(f"{name}: builder installs {p}, which scripts/install-deps.sh does not")
                if "cmake -S" in arg:
                    if "-DPEREGRINE_BUILD_TESTS=OFF" not in arg:
                        errors.append(f"{name}: the builder's cmake configuration leaves the tests on")
                    if "--target peregrine" not in arg:
                        errors.append(f"{name}: the builder builds more than the peregrine target")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    deps = deps_packages(root)
    errors = []

    # Self-check.
    bad = ("FROM debian:12 AS builder\nRUN apt-get update && apt-get install -y cmake no-such-package "
           "&& cmake -S . -B build -DPEREGRINE_BUILD_TESTS=OFF && cmake --build build --target peregrine\n"
           "COPY no-such-dir/ x/\nFROM debian:12-slim\nCOPY --from=builder /src/build/peregrine /usr/local/bin/\n"
           "EXPOSE 8000\nENTRYPOINT [\"peregrine\"]\n")
    check_dockerfile("self-check", bad, root, deps, [], errors)
    expected = ["no-such-package", "no-such-dir", "not written by that stage"]
    missing = [e for e in expected if not any(e in x for x in errors)]
    if missing:
        print(f"dockerfiles test: FAILED: the self-check did not report {missing} (got {errors})")
        return 1
    errors = []

    ddir = os.path.join(root, "deploy", "docker")
    files = sorted(f for f in os.listdir(ddir) if f.startswith("Dockerfile") and not f.endswith(".dockerignore"))
    for f in files:
        ign = os.path.join(ddir, f + ".dockerignore")
        patterns = []
        if os.path.exists(ign):
            patterns = [ln.strip() for ln in open(ign) if ln.strip() and not ln.startswith("#")]
        else:
            errors.append(f"{f}: no {f}.dockerignore (the context is the repository root, build folders included)")
        check_dockerfile(f, open(os.path.join(ddir, f)).read(), root, deps, patterns, errors)
    if not files:
        errors.append("no Dockerfile in deploy/docker")
    if errors:
        for e in errors:
            print("  " + e, file=sys.stderr)
        print(f"dockerfiles test: FAILED: {len(errors)} problems in {len(files)} Dockerfiles")
        return 1
    print(f"dockerfiles test: ok ({', '.join(files)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
