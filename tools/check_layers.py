#!/usr/bin/env python3
"""The layer check: every #include in src/, cli/ and python/src/ points to its own floor or one below.

The floors are declared once, in docs/architecture.md, between the lines
`<!-- floors: top first -->` and `<!-- /floors -->`: one floor per line, its folder's name first (the
folder under src/, or `cli`, `python`). The rules, with no list of exceptions:
  1. A file includes only files of its own floor or of a floor below it.
  2. Within a floor, a subfolder never includes a sibling subfolder (backends/cuda does not include
     backends/cpu, models/gpt2 does not include models/llama); the floor's own folder and its
     subfolders may include each other (a registry names its families, a family uses the shared code).
  3. Every folder under src/ is a declared floor, so a new folder must be placed before it is used.
  4. The floors named on the line `<!-- ops only: ... -->` (nn, models) include nothing from backends/:
     they reach kernels only through ops, which validate and dispatch to a device's kernel.
Quoted includes are resolved as the compiler does here: beside the including file, then under src/,
then under the repository root. Usage: tools/check_layers.py [--root DIR]; exits 1 on any violation.
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = re.compile(r"\.(h|hpp|cpp|cc|inc|cu|cuh)$")


def read_floors(root):
    """The floors from docs/architecture.md, bottom first: a list of names."""
    path = os.path.join(root, "docs", "architecture.md")
    lines = open(path, encoding="utf-8").read().splitlines()
    try:
        start = lines.index("<!-- floors: top first -->")
        end = lines.index("<!-- /floors -->", start)
    except ValueError:
        sys.exit(f"check_layers: {path} has no <!-- floors: top first --> ... <!-- /floors --> block")
    names = []
    for line in lines[start + 1:end]:
        word = line.strip().strip("`").split()
        if not word or word[0].startswith("```"):
            continue
        name = word[0].strip("`").rstrip("/")
        if name.startswith("src/"):
            name = name[4:]
        names.append(name)
    if len(set(names)) != len(names):
        sys.exit(f"check_layers: a floor is declared twice in {path}: {names}")
    return list(reversed(names))


KERNELS = "backends"  # the floor of the kernels, which the ops-only floors reach only through ops


def read_ops_only(root, floors):
    """The floors named on docs/architecture.md's `<!-- ops only: ... -->` line: a set of names."""
    path = os.path.join(root, "docs", "architecture.md")
    for line in open(path, encoding="utf-8").read().splitlines():
        m = re.fullmatch(r"<!-- ops only:(.*)-->", line.strip())
        if m:
            names = set(m.group(1).split())
            unknown = sorted(names - set(floors))
            if unknown:
                sys.exit(f"check_layers: {path}'s ops-only line names {unknown}, which are not floors")
            return names
    sys.exit(f"check_layers: {path} has no <!-- ops only: ... --> line")


def place(rel):
    """(floor, subfolder) of a repository-relative path, e.g. ('models', 'llama'), or None."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) >= 3:
        return parts[1], (parts[2] if len(parts) >= 4 else "")
    if parts[0] == "cli":
        return "cli", ""
    if parts[:2] == ["python", "src"]:
        return "python", ""
    return None


def resolve(root, rel, include):
    here = os.path.dirname(rel)
    for base in (here, "src", ""):
        candidate = os.path.normpath(os.path.join(base, include))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def check(root):
    floors = read_floors(root)
    ops_only = read_ops_only(root, floors)
    rank = {name: i for i, name in enumerate(floors)}
    problems = []
    for folder in sorted(os.listdir(os.path.join(root, "src"))):
        if os.path.isdir(os.path.join(root, "src", folder)) and folder not in rank:
            problems.append(f"src/{folder}/ is not a floor in docs/architecture.md: declare where it stands")
    files = []
    for top in ("src", "cli", os.path.join("python", "src")):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(dirpath, n), root) for n in names if SOURCES.search(n)]
    edges = 0
    for rel in sorted(files):
        src = place(rel)
        if src is None or src[0] not in rank:
            continue
        for number, line in enumerate(open(os.path.join(root, rel), encoding="utf-8", errors="replace"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(root, rel, m.group(1))
            if target is None:
                problems.append(f"{rel}:{number}: #include \"{m.group(1)}\" does not resolve to a file")
                continue
            dst = place(target)
            if dst is None:
                continue  # outside the layered code (a test helper, a generated file)
            edges += dst[0] != src[0]
            if dst[0] not in rank:
                problems.append(f"{rel}:{number}: includes {target}, which is in no declared floor")
            elif rank[dst[0]] > rank[src[0]]:
                problems.append(f"{rel}:{number}: includes {target}: floor {src[0]} may not include "
                                f"{dst[0]}, which stands above it")
            elif dst[0] == src[0] and src[1] and dst[1] and src[1] != dst[1]:
                problems.append(f"{rel}:{number}: includes {target}: {src[0]}/{src[1]} may not include its "
                                f"sibling {dst[0]}/{dst[1]}")
            elif src[0] in ops_only and dst[0] == KERNELS:
                problems.append(f"{rel}:{number}: includes {target}: floor {src[0]} reaches {KERNELS} only "
                                f"through ops")
    return floors, files, edges, problems


def self_test(root):
    """Shows that the check can fail: on a copy of the tree, each planted violation must be reported."""
    import shutil
    import tempfile

    plants = [
        ("src/core/tensor.h", '#include "train/trainer.h"\n', "floor core may not include train"),
        ("src/backends/cuda/runtime.h", '#include "backends/cpu/gemm.h"\n',
         "backends/cuda may not include its sibling backends/cpu"),
        ("src/models/gpt2/model.h", '#include "models/llama/model.h"\n',
         "models/gpt2 may not include its sibling models/llama"),
        ("src/newfloor/thing.h", "#pragma once\n", "src/newfloor/ is not a floor"),
        ("src/models/llama/model.h", '#include "backends/cpu/gemm.h"\n', "floor models reaches backends only through ops"),
    ]
    failures = 0
    for path, line, expected in plants:
        with tempfile.TemporaryDirectory() as tmp:
            for part in ("src", "cli", os.path.join("python", "src"), "docs"):
                shutil.copytree(os.path.join(root, part), os.path.join(tmp, part))
            target = os.path.join(tmp, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "a", encoding="utf-8") as f:
                f.write(line)
            problems = check(tmp)[3]
            caught = any(expected in p for p in problems)
            print(f"{'caught' if caught else 'MISSED'}: {line.strip()} in {path} ({expected})")
            failures += not caught
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--self-test", action="store_true",
                        help="plant an upward, a sibling, an undeclared-folder and a kernel include in a copy "
                             "of the tree and check that each is reported")
    args = parser.parse_args()
    if args.self_test:
        return self_test(os.path.abspath(args.root))
    floors, files, edges, problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) of the floors in docs/architecture.md")
        return 1
    print(f"check_layers: {len(files)} files, {edges} includes between floors, all downward "
          f"({' < '.join(floors)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
