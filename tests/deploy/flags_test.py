#!/usr/bin/python3
"""Every `peregrine` command line in deploy/ names a subcommand and options that the binary has.

Command lines are collected from
  - Kubernetes containers (command + args) and compose services (entrypoint + command; the
    image's entrypoint is `peregrine`),
  - Dockerfiles (ENTRYPOINT + CMD of each stage; `peregrine ...` in RUN),
  - any other text in deploy/ (comments, shell strings): `peregrine SUBCOMMAND --flag ...`.
Each option must appear in `peregrine SUBCOMMAND --help`; a value given to an option with a
fixed set of choices ({a,b}) or a range ([lo - hi]) must be one of them, unless it is a
$(VAR)/${VAR} substitution. A self-check makes sure that an unknown option is reported.

usage: flags_test.py PEREGRINE_BINARY [REPO_ROOT]"""
import json
import os
import re
import shlex
import subprocess
import sys

import yaml

# Subcommands a deploy file may use although the binary may not have them yet (reported then).
EXPECTED_SUBCOMMANDS = {"serve", "router"}


def run_help(binary, sub):
    args = [binary] + ([sub] if sub else []) + ["--help"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=20)
    return p.returncode, p.stdout + p.stderr


def parse_help(text):
    """{option: {"takes_value": bool, "choices": set|None, "range": (lo, hi)|None}} from CLI11's
    help, and the subcommands it lists."""
    opts, subs = {}, set()
    section = None
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            section = line[:-1].strip().lower()
            continue
        m = re.match(r"^  (-\S+)(.*)$", line)
        if m and section == "options":
            spec, rest = m.group(1), m.group(2)
            # `--a,--b{false}`, `--x TEXT:{a,b}=a`, `--n INT:INT in [1 - 64]=1`
            names = re.findall(r"--[A-Za-z0-9][A-Za-z0-9-]*", spec)
            typ = rest.strip().split("  ")[0]
            takes = bool(re.match(r"^(TEXT|INT|UINT|FLOAT|FLOAT:|BOOLEAN|\w+:)", typ))
            choices = re.search(r":\{([^}]*)\}", typ)
            rng = re.search(r"in \[(-?[0-9.]+) - (-?[0-9.]+)\]", typ)
            info = {"takes_value": takes,
                    "choices": set(choices.group(1).split(",")) if choices else None,
                    "range": (float(rng.group(1)), float(rng.group(2))) if rng else None}
            for n in names:
                opts[n] = info
        m = re.match(r"^  ([a-z][a-z0-9-]*)\s{2,}\S", line)
        if m and section == "subcommands":
            subs.add(m.group(1))
    return opts, subs


class Checker:
    def __init__(self, get_help):
        """get_help(subcommand or None) -> (exit code, help text)."""
        self.get_help = get_help
        rc, top = get_help(None)
        if rc != 0:
            raise SystemExit(f"--help failed ({rc})")
        self.top_opts, self.subcommands = parse_help(top)
        self.helps = {}
        self.errors = []
        self.used = {}  # subcommand -> set of options seen

    def options_of(self, sub):
        if sub not in self.helps:
            rc, text = self.get_help(sub)
            self.helps[sub] = parse_help(text)[0] if rc == 0 else None
        return self.helps[sub]

    def check_argv(self, argv, where):
        """argv starts after `peregrine`."""
        sub = None
        if argv and not argv[0].startswith("-"):
            sub, argv = argv[0], argv[1:]
            if sub not in self.subcommands:
                if sub in EXPECTED_SUBCOMMANDS:
                    self.errors.append(f"{where}: `peregrine {sub}` is not in this binary yet "
                                       f"(its subcommands: {', '.join(sorted(self.subcommands))})")
                else:
                    self.errors.append(f"{where}: unknown subcommand `peregrine {sub}`")
                return
        opts = self.top_opts if sub is None else self.options_of(sub)
        if opts is None:
            self.errors.append(f"{where}: `peregrine {sub} --help` failed")
            return
        label = sub or "(top level)"
        seen = self.used.setdefault(label, set())
        i = 0
        while i < len(argv):
            a = argv[i]
            i += 1
            if not a.startswith("--"):
                continue
            name, eq, value = a.partition("=")
            seen.add(name)
            info = opts.get(name)
            if info is None:
                self.errors.append(f"{where}: `peregrine {label} {name}`: no such option")
                continue
            if not eq and info["takes_value"] and i < len(argv) and not argv[i].startswith("--"):
                value = argv[i]
                i += 1
            if (info["choices"] or info["range"]) and value and not re.search(r"\$[({]", value):
                if info["choices"] and value not in info["choices"]:
                    self.errors.append(f"{where}: `{name} {value}`: not one of {sorted(info['choices'])}")
                if info["range"]:
                    try:
                        v = float(value)
                        lo, hi = info["range"]
                        if not lo <= v <= hi:
                            self.errors.append(f"{where}: `{name} {value}`: outside [{lo:g}, {hi:g}]")
                    except ValueError:
                        self.errors.append(f"{where}: `{name} {value}`: not a number")


SAMPLE_HELP = {
    None: "Usage: peregrine [OPTIONS] [SUBCOMMAND]\n\nOptions:\n  -h,--help                   Print this help\n"
          "\nSubcommands:\n  serve                       Serve\n",
    "serve": "Usage: peregrine serve [OPTIONS]\n\nOptions:\n  -h,--help                   Print this help\n"
             "  --device TEXT:{auto,cuda,cpu}=auto\n                              Device\n"
             "  --port INT:INT in [0 - 65535]=8000\n                              Port\n"
             "  --flag                      A flag\n",
}


def is_peregrine(word):
    return os.path.basename(word) == "peregrine"


def strings_in(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from strings_in(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings_in(v)


def as_list(v):
    if v is None:
        return []
    return shlex.split(v) if isinstance(v, str) else [str(x) for x in v]


def argvs_in_yaml(doc):
    """peregrine command lines (the words after `peregrine`) of a parsed YAML document."""
    out = []
    if isinstance(doc, dict) and isinstance(doc.get("services"), dict):  # compose
        for name, svc in doc["services"].items():
            if not isinstance(svc, dict):
                continue
            entry = as_list(svc.get("entrypoint"))
            ours = "peregrine" in str(svc.get("image", "")) or "peregrine" in json.dumps(svc.get("build", ""))
            if not entry and ours:
                entry = ["peregrine"]
            argv = entry + as_list(svc.get("command"))
            if argv and is_peregrine(argv[0]):
                out.append((f"services.{name}", argv[1:]))
        return out

    def walk(node, path):
        if isinstance(node, dict):
            if "image" in node and ("command" in node or "args" in node):  # a container
                cmd = as_list(node.get("command"))
                if not cmd and "peregrine" in str(node.get("image")):
                    cmd = ["peregrine"]  # the image's ENTRYPOINT
                argv = cmd + as_list(node.get("args"))
                if argv and is_peregrine(argv[0]):
                    out.append((f"{path}/{node.get('name', '?')}", argv[1:]))
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
    walk(doc, "")
    return out


def dockerfile_instructions(text):
    """(instruction, argument) pairs, continuation lines joined, comments dropped."""
    lines, cur = [], ""
    for raw in text.splitlines():
        if not cur and raw.lstrip().startswith("#"):
            continue
        if cur and raw.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        cur += raw
        if cur.strip():
            word, _, rest = cur.strip().partition(" ")
            lines.append((word.upper(), rest.strip()))
        cur = ""
    return lines


def exec_or_shell(arg):
    arg = arg.strip()
    if arg.startswith("["):
        try:
            return [str(x) for x in json.loads(arg)]
        except ValueError:
            pass
    return ["/bin/sh", "-c", arg]


def argvs_in_dockerfile(text):
    out, stage = [], None
    entry, cmd = [], []

    def close():
        argv = entry + cmd
        if argv and is_peregrine(argv[0]):
            out.append((f"stage {stage}: ENTRYPOINT+CMD", argv[1:]))
    for ins, arg in dockerfile_instructions(text):
        if ins == "FROM":
            if stage is not None:
                close()
            stage, entry, cmd = arg, [], []
        elif ins == "ENTRYPOINT":
            entry, cmd = exec_or_shell(arg), []  # ENTRYPOINT resets CMD
        elif ins == "CMD":
            cmd = exec_or_shell(arg)
    if stage is not None:
        close()
    return out


# `peregrine SUBCOMMAND ...` or `peregrine --flag` inside free text (comments, shell strings).
TEXT_RE = re.compile(r"(?:^|[\s\"'`(/])peregrine\s+([a-z][a-z-]*|--[a-z][a-z0-9-]*)([^\n;&|)`]*)")


def argvs_in_text(text, subcommands):
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in TEXT_RE.finditer(line):
            first, rest = m.group(1), m.group(2)
            if not first.startswith("--") and first not in subcommands | EXPECTED_SUBCOMMANDS:
                continue  # prose ("peregrine image"), not a command
            try:
                words = shlex.split(rest, comments=True)
            except ValueError:
                words = rest.split()
            words = [w.rstrip(",") for w in words]
            out.append((f"line {lineno}", [first] + words))
    return out


def collect(root, subcommands):
    deploy = os.path.join(root, "deploy")
    found = []
    for dirpath, _, files in os.walk(deploy):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            with open(path, errors="replace") as fh:
                text = fh.read()
            if f.endswith((".yaml", ".yml")):
                for i, doc in enumerate(yaml.safe_load_all(text)):
                    found += [(f"{rel} (doc {i + 1}, {w})", a) for w, a in argvs_in_yaml(doc)]
            elif f.startswith("Dockerfile") and not f.endswith(".dockerignore"):
                found += [(f"{rel} ({w})", a) for w, a in argvs_in_dockerfile(text)]
            found += [(f"{rel}:{w[5:]}", a) for w, a in argvs_in_text(text, subcommands)]
    return found


def main():
    binary = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    # Self-check on a help text of CLI11's format: an option the binary lacks, a value outside
    # the choices, one out of range and a missing expected subcommand are each reported; a
    # flag without value and a $(VAR) value are not.
    fake = Checker(lambda sub: (0, SAMPLE_HELP.get(sub, "")))
    fake.check_argv(["serve", "--no-such-option", "--device", "tpu", "--port", "70000", "--flag",
                     "--device", "$(DEVICE)"], "self-check")
    fake.check_argv(["router", "--backend", "http://a:1"], "self-check")
    if len(fake.errors) != 4:
        print(f"flags test: FAILED: the self-check found {fake.errors}, expected 4 errors", file=sys.stderr)
        return 1

    c = Checker(lambda sub: run_help(binary, sub))

    found = collect(root, c.subcommands)
    for where, argv in found:
        c.check_argv(argv, where)
    if not found:
        c.errors.append("no peregrine command line found in deploy/")
    summary = "; ".join(f"{sub}: {len(opts)} options" for sub, opts in sorted(c.used.items()))
    if c.errors:
        for e in sorted(set(c.errors)):
            print("  " + e, file=sys.stderr)
        print(f"flags test: FAILED: {len(set(c.errors))} problems in {len(found)} command lines ({summary})")
        return 1
    print(f"flags test: ok ({len(found)} command lines; {summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
