#!/usr/bin/env bash
# The call pipeline's cost, before and after a change (issue 30: within 5%):
# host.get_record throughput against the baseline server (tests/load, side
# by side, JSON-RPC and XML-RPC) and a forwarded call's latency
# (tests/pool/core TestForwardingFigures: host.get_record p50 on a member,
# forwarded to the coordinator). Both builds run alternately, ROUNDS pairs,
# so that the machine's drift weighs on both alike.
#
#   scripts/pipeline-cost.sh BEFORE [AFTER] [ROUNDS]
#
# BEFORE and AFTER are git revisions (AFTER defaults to the working tree).
# Prints one line per run; compare the medians. Needs what tests/pool
# needs (127.0.0.N addresses, root for the fault proxies' addresses).
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: scripts/pipeline-cost.sh BEFORE [AFTER] [ROUNDS]}
after=${2:-}
rounds=${3:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/pipeline-cost.XXXXXX")
trap 'rm -rf "$work"' EXIT

build() { # rev dir
  mkdir -p "$2/src"
  if [ -z "$1" ]; then
    go build -o "$2/" ./cmd/toolstackd ./cmd/xe
  else
    git archive "$1" | tar -x -C "$2/src"
    (cd "$2/src" && go build -o "$2/" ./cmd/toolstackd ./cmd/xe)
  fi
}
build "$before" "$work/before"
build "$after" "$work/after"
go test -c -o "$work/core.test" ./tests/pool/core

for i in $(seq "$rounds"); do
  for w in before after; do
    b="$work/$w"
    tp=$(TOOLSTACKD_BIN="$b/toolstackd" tests/load/run.sh -tests throughput -rounds 2 -duration 2s 2>/dev/null |
      grep -E '^\| (JSON-RPC|XML-RPC) +\| [0-9.]+ ' | awk -F'|' '{gsub(/ /,"",$2); split($4, s, " "); printf "%s %s  ", $2, s[1]}')
    fw=$(cd tests/pool/core && TOOLSTACKD_FIGURES=1 TOOLSTACKD_BIN="$b/toolstackd" XE_BIN="$b/xe" \
      "$work/core.test" -test.run TestForwardingFigures -test.v -test.count=1 2>&1 |
      grep -oE "a member's \(forwarded\) [^;]+" | head -1)
    echo "round $i $w: throughput toolstackd/baseline side by side: $tp| $fw"
  done
done
