#!/usr/bin/env bash
# Copies the project's non-generated, non-test Go code (everything under
# cmd/ and internal/ except *_test.go and the generated zz_*.go) as it is
# at REV, or in the working tree when REV is empty, into DIR: the code
# issue 11's figures are counted over (scripts/dupfigure.sh,
# scripts/dupsurvivors.sh).
#
#   scripts/export-gosrc.sh REV DIR
set -euo pipefail
rev="$1"
dir="$2"
cd "$(dirname "$0")/.."
if [ -n "$rev" ]; then
  files=$(git ls-tree -r --name-only "$rev" -- cmd internal)
else
  files=$(git ls-files -co --exclude-standard -- cmd internal)
fi
for f in $files; do
  case "$f" in
    *_test.go | */zz_*.go) continue ;;
    *.go) ;;
    *) continue ;;
  esac
  mkdir -p "$dir/$(dirname "$f")"
  if [ -n "$rev" ]; then
    git show "$rev:$f" >"$dir/$f"
  elif [ -f "$f" ]; then
    cp "$f" "$dir/$f"
  fi
done
