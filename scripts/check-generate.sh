#!/usr/bin/env bash
# Fails when `go generate` would change a tracked file.
set -euo pipefail
cd "$(dirname "$0")/.."
go generate ./...
if ! git diff --exit-code --stat -- . ; then
  echo "generated files are stale: run 'make generate' and commit" >&2
  exit 1
fi
