#!/usr/bin/env bash
# Prints the figures of the tree's shape issue 30 asks for (package sizes,
# methods per type, package docs, upward imports; scripts/structure), and
# the duplicates of 10 or more lines when the duplicates tool is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
go run ./scripts/structure
if command -v duplicates >/dev/null; then
  echo
  echo "## Duplicates of 10 or more lines (duplicates --min-lines 10)"
  duplicates --min-lines 10 --most 40 --seconds 300 | head -1
fi
