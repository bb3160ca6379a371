#!/usr/bin/env bash
# Fails when `go generate` changes anything: the generated files in the
# tree must be what the generators make from their inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
state() { { git ls-files -z; git ls-files -z -o --exclude-standard; } | sort -zu | xargs -0 md5sum 2>/dev/null || true; }
before=$(state)
go generate ./...
after=$(state)
if [ "$before" != "$after" ]; then
  diff <(echo "$before") <(echo "$after") | sed -n '1,20p' >&2
  echo "generated files are stale: run 'make generate' and commit" >&2
  exit 1
fi
echo "generated files are current"
