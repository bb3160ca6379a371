#!/usr/bin/env bash
# Issue 11's code-health figure: the pairs of places that the library's
# `duplicates` tool finds in the project's non-generated, non-test Go code
# (everything tracked under cmd/ and internal/ except *_test.go and the
# generated zz_*.go), split by kind:
#
#   imports      both sides lie inside import blocks (two files that use
#                the same packages; nothing to share)
#   boilerplate  shape-only pairs the tool itself marks as boilerplate
#                (error variable blocks, String switches, option structs)
#   code         the rest: places to read for logic written twice
#
#   scripts/dupfigure.sh [REV]      # default: the working tree
#
# Needs the `duplicates` command from the tool library on PATH.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:-}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$root"
scripts/export-gosrc.sh "$rev" "$tmp/src"
(cd "$tmp/src" && duplicates --most 200 --seconds 300) >"$tmp/pairs.txt"
python3 - "$tmp/src" "$tmp/pairs.txt" <<'EOF'
import re, sys
src, pairs = sys.argv[1], sys.argv[2]

def import_lines(path):
    lines = open(f"{src}/{path}", encoding="utf-8", errors="replace").read().split("\n")
    inside, out = False, set()
    for i, l in enumerate(lines, 1):
        s = l.strip()
        if s.startswith("import ("):
            inside = True
        if inside or s.startswith("import ") or s == "" or s.startswith("package ") or s.startswith("//"):
            out.add(i)
        if inside and s == ")":
            inside = False
    return out

cache = {}
def in_imports(side):
    path, rng = side.rsplit(":", 1)
    a, b = map(int, rng.split("-"))
    if path not in cache:
        cache[path] = import_lines(path)
    return all(i in cache[path] for i in range(a, b + 1))

kinds = {"imports": [], "boilerplate": [], "code": []}
for line in open(pairs):
    m = re.match(r"D\d+ (\S+) ~ (\S+)(.*)", line)
    if not m:
        continue
    a, b, rest = m.groups()
    if in_imports(a) and in_imports(b):
        kinds["imports"].append(line.rstrip())
    elif "boilerplate" in rest:
        kinds["boilerplate"].append(line.rstrip())
    else:
        kinds["code"].append(line.rstrip())
total = sum(len(v) for v in kinds.values())
print(f"{total} pairs: {len(kinds['code'])} code, {len(kinds['boilerplate'])} boilerplate, {len(kinds['imports'])} import blocks")
for k in ("code", "boilerplate", "imports"):
    print(f"\n{k}:")
    for l in kinds[k]:
        print("  " + l)
EOF
grep -E '^(left out|incomplete):' "$tmp/pairs.txt" || true
