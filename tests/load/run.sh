#!/usr/bin/env bash
# Load measurements of toolstackd's XenAPI over the wire (docs/performance.md,
# "Issue 3: XenAPI over the wire"). Builds toolstackd and tsload into a
# temporary directory (bin/ is left alone), starts the daemon on a free
# loopback port with a fresh data dir and RLIMIT_NOFILE 65536, runs
# tests/load/cmd/tsload against it and prints the results as markdown.
#
#   tests/load/run.sh                      # everything, about 2.5 minutes
#   tests/load/run.sh -tests throughput    # extra arguments go to tsload
#   tests/load/run.sh -duration 2s -rounds 1 -polls 1000 -vms 1000   # quick
#
# Environment: TOOLSTACKD_BIN (use this daemon binary instead of building),
# LOAD_OUT (also copy the markdown results there), LOAD_KEEP=1 (keep the
# temporary directory with the daemon log).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/toolstackd-load.XXXXXX")"
password="load-Root-$$-pw"
daemon_pid=""

cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -KILL "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  if [ "${LOAD_KEEP:-0}" = 1 ]; then
    echo "load: kept $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cd "$root"
echo "load: building into $work" >&2
if [ -n "${TOOLSTACKD_BIN:-}" ]; then
  bin="$TOOLSTACKD_BIN"
else
  bin="$work/toolstackd"
  go build -o "$bin" ./cmd/toolstackd
fi
go build -o "$work/tsload" ./tests/load/cmd/tsload

port="$("$work/tsload" freeport)"
mkdir -p "$work/data"

# 10,000 long polls need 10,000 descriptors in the daemon.
if ! ulimit -n 65536 2>/dev/null; then
  ulimit -n "$(ulimit -Hn)" || true
  echo "load: could not raise RLIMIT_NOFILE to 65536 (now $(ulimit -n)); the 10,000-poll test may fail" >&2
fi

# Every load client comes from 127.0.0.1, so the cap on one address's
# connections (a defence against one hostile client) is lifted; the
# daemon's total cap (the file limit less a reserve) still holds.
TOOLSTACKD_ROOT_PASSWORD="$password" "$bin" --data-dir "$work/data" --listen "127.0.0.1:$port" \
  --backend simulator --log-level warn --max-conns-per-client 65536 >"$work/daemon.log" 2>&1 &
daemon_pid=$!

for _ in $(seq 1 200); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  if ! kill -0 "$daemon_pid" 2>/dev/null; then
    echo "load: daemon exited early:" >&2; cat "$work/daemon.log" >&2; exit 1
  fi
  sleep 0.05
done
echo "load: toolstackd pid $daemon_pid on 127.0.0.1:$port" >&2

status=0
"$work/tsload" -addr "127.0.0.1:$port" -pid "$daemon_pid" -password "$password" -out "$work/results.md" "$@" || status=$?

if ! kill -0 "$daemon_pid" 2>/dev/null; then
  echo "load: the daemon died during the run; its log:" >&2
  tail -50 "$work/daemon.log" >&2
  exit 1
fi
kill -TERM "$daemon_pid"
for _ in $(seq 1 150); do
  kill -0 "$daemon_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$daemon_pid" 2>/dev/null; then
  echo "load: the daemon did not stop within 15 s of SIGTERM" >&2
  status=1
else
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=""
fi
if [ -s "$work/daemon.log" ]; then
  echo "load: daemon log (warnings and errors):" >&2
  tail -20 "$work/daemon.log" >&2
fi
if [ -n "${LOAD_OUT:-}" ] && [ -f "$work/results.md" ]; then
  cp "$work/results.md" "$LOAD_OUT"
fi
exit "$status"
