#!/usr/bin/env bash
# Runs a package's tests again and again on a loaded machine, to catch the
# tests that fail only when the CPUs are busy:
#
#   scripts/flake.sh PKG N [go test args...]
#   scripts/flake.sh ./internal/db/... 10 -run TestRedo
#
# Runs `go test -json -race -count=1 PKG [args...]` N times through
# tests/report while one busy loop per core (nproc of them) keeps every CPU
# busy for the whole time; FLAKE_NOLOAD=1 runs without them. Prints each
# run's wall time and the tests that failed in it, and last
# "flake: PKG: K of N runs failed". Each run's output (go test -v's text,
# run-I.log) and summary (run-I.json, tests/report's), and runs.tsv (run,
# seconds, ok/FAIL, failed tests) are kept in a directory it prints
# (FLAKE_DIR to choose it). Exits 1 if any run failed, 2 on a usage error.
#
# The tests are built (and run with -run '^$') once before the load starts,
# so that the times are the tests' own; go test args that change the build
# (-tags, ...) make the first run build again.
set -euo pipefail

usage() {
  echo "usage: scripts/flake.sh PKG N [go test args...]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
pkg=$1 n=$2
shift 2
case $n in '' | *[!0-9]*) usage ;; esac
[ "$n" -gt 0 ] || usage
cd "$(dirname "$0")/.."

dir=${FLAKE_DIR:-$(mktemp -d -t toolstackd-flake.XXXXXX)}
mkdir -p "$dir"
report=$dir/report
go build -o "$report" ./tests/report

loops=()
stop_load() {
  local p
  for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${loops[@]}"; do wait "$p" 2>/dev/null || true; done
  loops=()
}
trap stop_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "flake: building $pkg's tests"
if ! go test -race -count=1 -run '^$' "$pkg" >"$dir/build.log" 2>&1; then
  echo "flake: go test -run '^\$' $pkg failed (the runs will show why; $dir/build.log)"
fi

if [ "${FLAKE_NOLOAD:-0}" = 1 ]; then
  load="no load (FLAKE_NOLOAD=1)"
else
  cores=$(nproc)
  for _ in $(seq "$cores"); do
    sh -c 'while :; do :; done' &
    loops+=($!)
  done
  load="$cores busy loops (nproc $cores)"
fi
echo "flake: $n runs of go test -race -count=1 $pkg${*:+ $*}, with $load; logs in $dir"

printf 'run\tseconds\tresult\tfailed\n' >"$dir/runs.tsv"
failed=0
times=()
for i in $(seq "$n"); do
  start=$(date +%s.%N)
  rc=0
  go test -json -race -count=1 "$pkg" "$@" 2>&1 |
    "$report" -v -name "run $i" -summary "$dir/run-$i.json" >"$dir/run-$i.log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  times+=("$secs")
  if [ "$rc" = 0 ]; then
    printf 'run %d: ok   %7ss\n' "$i" "$secs"
    printf '%d\t%s\tok\t\n' "$i" "$secs" >>"$dir/runs.tsv"
    continue
  fi
  failed=$((failed + 1))
  # "PKG: TestA, TestB; PKG2: TestC" from report -failed's "PKG TEST" lines.
  names=$("$report" -failed "$dir/run-$i.json" 2>/dev/null | awk '
    { p = $1; $1 = ""; sub(/^ /, ""); if (!(p in l)) { o[++n] = p; l[p] = $0 } else l[p] = l[p] ", " $0 }
    END { for (i = 1; i <= n; i++) printf "%s%s: %s", (i > 1 ? "; " : ""), o[i], l[o[i]] }' || true)
  [ -n "$names" ] || names="(no failed test named; see run-$i.log)"
  printf 'run %d: FAIL %7ss  %s\n' "$i" "$secs" "$names"
  printf '%d\t%s\tFAIL\t%s\n' "$i" "$secs" "$names" >>"$dir/runs.tsv"
done
stop_load

printf '%s\n' "${times[@]}" | sort -n | awk '
  { t[NR] = $1 }
  END { printf "flake: wall time min %ss, median %ss, max %ss\n", t[1], t[int((NR + 1) / 2)], t[NR] }'
echo "flake: logs in $dir"
echo "flake: $pkg: $failed of $n runs failed"
[ "$failed" -eq 0 ]
