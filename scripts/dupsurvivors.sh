#!/usr/bin/env bash
# Issue 11's code-health figure read the other way: of the pairs of
# places the `duplicates` tool found over an earlier tree (the issue's,
# 389db31 by default), how many are still there in a later one (the
# working tree by default). A pair is still there when the text of both
# its sides still stands in the later tree's non-generated, non-test Go
# code, anywhere (code moved between files counts), to at least the
# given similarity (the share of a side's lines found in order in one
# window of the later tree; comments, blank lines and lone brackets
# aside). Printed for 100% (to the letter) and 80%.
#
#   scripts/dupsurvivors.sh [OLD_REV [NEW_REV]]
#
# Needs the `duplicates` command (through scripts/dupfigure.sh) and
# python3.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
old="${1:-389db31}"
new="${2:-}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$root"
scripts/export-gosrc.sh "$old" "$tmp/old"
scripts/export-gosrc.sh "$new" "$tmp/new"
scripts/dupfigure.sh "$old" >"$tmp/pairs.txt"
python3 - "$tmp/old" "$tmp/new" "$tmp/pairs.txt" <<'PY'
import difflib, os, re, sys
from collections import defaultdict
old_root, new_root, pairs = sys.argv[1:4]

def norm(line):
    s = line.strip()
    if not s or s.startswith("//") or s in ("{", "}", ")", "(", "},", "})", "),"):
        return None
    return re.sub(r"\s+", " ", s)

def read(path):
    return open(path, encoding="utf-8", errors="replace").read().split("\n")

cur, where = {}, defaultdict(list)
for d, _, names in os.walk(new_root):
    for n in names:
        if n.endswith(".go"):
            p = os.path.join(d, n)
            lines = [x for x in map(norm, read(p)) if x]
            cur[p] = lines
            for i, x in enumerate(lines):
                where[x].append((p, i))

def similarity(seq):
    if not seq:
        return 1.0
    best = 0.0
    starts = {(p, max(0, i - k)) for k, x in enumerate(seq) for p, i in where.get(x, [])[:200]}
    for p, s in starts:
        window = cur[p][s:s + len(seq) + 3]
        m = difflib.SequenceMatcher(None, seq, window, autojunk=False)
        best = max(best, sum(b.size for b in m.get_matching_blocks()) / len(seq))
        if best >= 1.0:
            break
    return best

kind, rows = None, []
for line in open(pairs):
    if re.match(r"^(code|boilerplate|imports):$", line.strip()):
        kind = line.strip()[:-1]
    m = re.match(r"\s+D\d+ (\S+) ~ (\S+)", line)
    if not m:
        continue
    sims = []
    for side in m.groups():
        path, span = side.rsplit(":", 1)
        a, b = map(int, span.split("-"))
        sims.append(similarity([x for x in map(norm, read(os.path.join(old_root, path))[a - 1:b]) if x]))
    rows.append((kind, min(sims), line.strip()))

print(f"{len(rows)} pairs in the earlier tree")
for t in (1.0, 0.8):
    kept = [r for r in rows if r[1] >= t]
    by = {k: sum(1 for r in kept if r[0] == k) for k in ("code", "boilerplate", "imports")}
    print(f"still there at {int(t * 100)}% similarity: {len(kept)} ({by['code']} code, {by['boilerplate']} boilerplate, {by['imports']} import blocks)")
for k, s, l in rows:
    print(f"  {'kept' if s >= 0.8 else 'gone'} {s:.2f} [{k}] {l}")
PY
