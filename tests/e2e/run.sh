#!/usr/bin/env bash
# End-to-end suites: unmodified third-party XenAPI clients against the real
# bin/toolstackd (simulator backend). Each suite gets a fresh daemon on a free
# loopback port with a fresh data directory and a known root password.
#
#   tests/e2e/run.sh              # every suite (make e2e builds first)
#   tests/e2e/run.sh xo flood     # only these suites
#
# Suites:
#   xo      node:test, Xen Orchestra's npm `xen-api` client (xo.test.mjs)
#   xenapi  python unittest, Debian's XenAPI.py and stdlib xmlrpc.client (test_xenapi.py)
#   flood   python unittest, malformed and oversized requests (test_flood.py)
#   restart python unittest, state across a SIGTERM and a restart on the same
#           data directory (test_restart.py phase1, then phase2)
#   ansible Debian's ansible-playbook with community.general's xenserver_guest,
#           xenserver_guest_info and xenserver_guest_powerstate over Debian's
#           XenAPI.py (ansible/guest.yml)
#
# Besides the tests inside each suite, the harness counts two checks per suite:
# the daemon is still running when the suite ends, and it exits on SIGTERM.
# The last line is "N passed, N failed" over everything.
#
# Environment: TOOLSTACKD_BIN (default bin/toolstackd), E2E_KEEP=1 keeps the
# temporary directory, E2E_SUITE_TIMEOUT (seconds, default 900).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${TOOLSTACKD_BIN:-$root/bin/toolstackd}"
suite_timeout="${E2E_SUITE_TIMEOUT:-900}"
password="e2e-Root-$$-pw"

all_suites=(xo xenapi flood restart ansible)
if [ $# -gt 0 ]; then suites=("$@"); else suites=("${all_suites[@]}"); fi
for name in "${suites[@]}"; do
  case " ${all_suites[*]} " in
    *" $name "*) ;;
    *)
      echo "e2e: unknown suite '$name' (known: ${all_suites[*]})" >&2
      echo "0 passed, 1 failed"
      exit 2
      ;;
  esac
done

if [ ! -x "$bin" ]; then
  echo "e2e: $bin not found; run 'make build' first (make e2e does)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/toolstackd-e2e.XXXXXX")"
daemon_pid=""

cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -KILL "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  if [ "${E2E_KEEP:-0}" = 1 ]; then
    echo "e2e: kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

# start_daemon NAME [ROOT_PASSWORD]: starts the daemon on $work/NAME/data
# (kept between starts) and a new free port; sets daemon_pid, port and
# daemon_log (appended to). Returns non-zero if the daemon does not accept TCP
# connections within 20 s.
start_daemon() {
  local name="$1" pw="${2:-$password}" data i
  data="$work/$name/data"
  mkdir -p "$data"
  daemon_log="$work/$name/daemon.log"
  port="$(free_port)"
  echo "--- start: toolstackd --data-dir $data --listen 127.0.0.1:$port --backend simulator" >>"$daemon_log"
  TOOLSTACKD_ROOT_PASSWORD="$pw" \
    "$bin" --data-dir "$data" --listen "127.0.0.1:$port" --backend simulator \
    >>"$daemon_log" 2>&1 &
  daemon_pid=$!
  for i in $(seq 1 200); do
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
      echo "e2e[$name]: daemon exited during startup" >&2
      return 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "e2e[$name]: daemon not listening on 127.0.0.1:$port after 20 s" >&2
  return 1
}

# stop_daemon: SIGTERM, then up to 15 s for it to exit; returns non-zero if it
# had to be killed.
stop_daemon() {
  local i
  [ -n "$daemon_pid" ] || return 0
  kill -TERM "$daemon_pid" 2>/dev/null || true
  for i in $(seq 1 150); do
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
      wait "$daemon_pid" 2>/dev/null || true
      daemon_pid=""
      return 0
    fi
    sleep 0.1
  done
  echo "e2e: daemon did not exit within 15 s of SIGTERM; killing it" >&2
  kill -KILL "$daemon_pid" 2>/dev/null || true
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=""
  return 1
}

print_log() {
  local log="$1" lines
  [ -f "$log" ] || return 0
  lines=$(wc -l <"$log")
  echo "----- daemon log ($log, $lines lines; last 300 shown) -----"
  tail -n 300 "$log"
  echo "----- end of daemon log -----"
}

ensure_node_modules() {
  if [ ! -f "$here/node_modules/xen-api/package.json" ]; then
    echo "e2e: installing npm dependencies (npm ci)"
    (cd "$here" && npm ci --no-audit --no-fund --silent)
  fi
}

# run_python FILE OUT [ARGS...]: runs a python suite against the daemon on
# $port and sets py_passed/py_failed from its "E2E-SUMMARY passed=N failed=N"
# line (a run that died without one counts as one failure).
run_python() {
  local file="$1" out="$2" rc=0 line
  shift 2
  py_passed=0 py_failed=0
  export E2E_URL="http://127.0.0.1:$port" E2E_PASSWORD="$password"
  (cd "$here" && timeout --kill-after=10 "$suite_timeout" python3 -u "$file" "$@" -v) 2>&1 | tee "$out" || rc=$?
  line=$(grep -E '^E2E-SUMMARY passed=[0-9]+ failed=[0-9]+$' "$out" | tail -n1 || true)
  if [ -n "$line" ]; then
    py_passed=$(echo "$line" | sed 's/.*passed=\([0-9]*\).*/\1/')
    py_failed=$(echo "$line" | sed 's/.*failed=\([0-9]*\)$/\1/')
  fi
  if [ "$rc" -ne 0 ] && [ "$py_failed" -eq 0 ]; then
    echo "e2e: $file exited with status $rc"
    py_failed=1
  fi
}

# run_ansible OUT: runs ansible/guest.yml against the daemon on $port and sets
# ans_passed/ans_failed from the play recap: every task that ended ok counts
# as passed (the assert tasks among them), a failed or unreachable task as
# failed. A failing task ends the play, so later tasks are not counted.
run_ansible() {
  local out="$1" rc=0 line xenapi_dir=/usr/lib/python3/dist-packages/os_xenapi/client
  ans_passed=0 ans_failed=0
  if ! command -v ansible-playbook >/dev/null; then
    echo "e2e[ansible]: ansible-playbook not found; run scripts/install-test-deps.sh"
    ans_failed=1
    return
  fi
  if [ ! -f "$xenapi_dir/XenAPI.py" ]; then
    echo "e2e[ansible]: $xenapi_dir/XenAPI.py not found (python3-os-xenapi)"
    ans_failed=1
    return
  fi
  mkdir -p "$work/ansible/home" "$work/ansible/tmp"
  # The modules `import XenAPI`: PYTHONPATH makes that Debian's XenAPI.py.
  # Ansible's own state goes into the suite's directory, not ~/.ansible.
  (cd "$here/ansible" &&
    E2E_URL="http://127.0.0.1:$port" E2E_PASSWORD="$password" \
      PYTHONPATH="$xenapi_dir" ANSIBLE_HOME="$work/ansible/home" \
      ANSIBLE_LOCAL_TEMP="$work/ansible/tmp" ANSIBLE_REMOTE_TEMP="$work/ansible/tmp" \
      ANSIBLE_CONFIG="$here/ansible/ansible.cfg" \
      timeout --kill-after=10 "$suite_timeout" \
      ansible-playbook -i localhost, guest.yml) 2>&1 | tee "$out" || rc=$?
  line=$(grep -E '^localhost +: ok=[0-9]+ ' "$out" | tail -n1 || true)
  if [ -n "$line" ]; then
    ans_passed=$(echo "$line" | sed 's/.* ok=\([0-9]*\).*/\1/')
    ans_failed=$(( $(echo "$line" | sed 's/.* failed=\([0-9]*\).*/\1/') + \
      $(echo "$line" | sed 's/.* unreachable=\([0-9]*\).*/\1/') ))
  fi
  if [ "$rc" -ne 0 ] && [ "$ans_failed" -eq 0 ]; then
    echo "e2e: ansible-playbook exited with status $rc"
    ans_failed=1
  fi
}

# run_suite NAME: runs one suite's client against the daemon on $port and
# writes "passed failed" into $work/NAME/counts.
run_suite() {
  local name="$1" out="$work/$1/output" rc=0 passed=0 failed=0
  export E2E_URL="http://127.0.0.1:$port" E2E_PASSWORD="$password"
  case "$name" in
    xo)
      ensure_node_modules || { echo "0 1" >"$work/$name/counts"; return; }
      # spec for people, TAP into a file for the counts.
      (cd "$here" && timeout --kill-after=10 "$suite_timeout" node --test \
        --test-reporter=spec --test-reporter-destination=stdout \
        --test-reporter=tap --test-reporter-destination="$work/$name/tap" \
        xo.test.mjs) 2>&1 | tee "$out" || rc=$?
      if [ -f "$work/$name/tap" ]; then
        # The final summary lines of the TAP stream count every test, nested
        # ones included: "# pass N", "# fail N", "# cancelled N".
        passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$work/$name/tap" | tail -n1)
        failed=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$work/$name/tap" | tail -n1)
        local cancelled
        cancelled=$(sed -n 's/^# cancelled \([0-9]*\)$/\1/p' "$work/$name/tap" | tail -n1)
        passed=${passed:-0}
        failed=$(( ${failed:-0} + ${cancelled:-0} ))
      fi
      ;;
    xenapi | flood)
      run_python "test_$name.py" "$out"
      passed=$py_passed failed=$py_failed
      ;;
    ansible)
      run_ansible "$out"
      passed=$ans_passed failed=$ans_failed
      ;;
    restart)
      # phase1 on the daemon run.sh started; then SIGTERM, a restart on the
      # same data directory with another root password in the environment,
      # and phase2. The SIGTERM stop is counted here; the main loop counts
      # the final one.
      export E2E_STATE="$work/$name/state.json" E2E_NEW_PASSWORD="$password-changed"
      run_python test_restart.py "$out.1" phase1
      passed=$py_passed failed=$py_failed
      if stop_daemon; then passed=$((passed + 1)); else
        echo "e2e[$name]: FAIL daemon did not stop on SIGTERM"
        failed=$((failed + 1))
      fi
      if start_daemon "$name" "$E2E_NEW_PASSWORD"; then
        run_python test_restart.py "$out.2" phase2
        passed=$((passed + py_passed)) failed=$((failed + py_failed))
      else
        echo "e2e[$name]: FAIL daemon did not come back on the same data directory"
        failed=$((failed + 1))
      fi
      ;;
  esac
  # A runner that died without reporting (or with failures it did not count)
  # still counts as one failure.
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "e2e[$name]: runner exited with status $rc"
    failed=1
  fi
  echo "$passed $failed" >"$work/$name/counts"
}

total_passed=0
total_failed=0
summary=()
for name in "${suites[@]}"; do
  mkdir -p "$work/$name"
  echo "=== e2e suite: $name ==="
  p=0 f=0
  if start_daemon "$name"; then
    run_suite "$name"
    read -r p f <"$work/$name/counts"
    if kill -0 "$daemon_pid" 2>/dev/null; then
      p=$((p + 1))
    else
      st=0
      wait "$daemon_pid" 2>/dev/null || st=$?
      echo "e2e[$name]: FAIL daemon is no longer running after the suite (exit status $st)"
      f=$((f + 1))
      daemon_pid=""
    fi
    if [ -n "$daemon_pid" ]; then
      if stop_daemon; then p=$((p + 1)); else
        echo "e2e[$name]: FAIL daemon did not stop on SIGTERM"
        f=$((f + 1))
      fi
    fi
  else
    f=1
    stop_daemon || true
  fi
  if [ "$f" -gt 0 ]; then print_log "$daemon_log"; fi
  echo "e2e suite $name: $p passed, $f failed"
  summary+=("$name: $p passed, $f failed")
  total_passed=$((total_passed + p))
  total_failed=$((total_failed + f))
done

echo "=== e2e summary ==="
for line in "${summary[@]}"; do echo "  $line"; done
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
