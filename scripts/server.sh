#!/usr/bin/env bash
# `make start` / `make stop`: corral serve in the background, its pid and log in the data directory. Idempotent:
# start when it already runs, or stop when it does not, says so and succeeds. The address comes from CORRAL_URL
# (default http://127.0.0.1:8000), the data directory from CORRAL_DATA_DIR (default ./data), as for `corral env`.
set -euo pipefail
umask 077  # the log may name workspaces and errors: private, like the rest of the data directory
cd "$(dirname "$0")/.."

URL="${CORRAL_URL:-http://127.0.0.1:8000}"
# Absolute, so that the environment check below matches however start and stop were given the same directory.
DATA_DIR="$(realpath -m -- "${CORRAL_DATA_DIR:-data}")"
PID_FILE="$DATA_DIR/corral.pid"
LOG_FILE="$DATA_DIR/corral.log"
PY=.venv/bin/python

die() { echo "server.sh: $*" >&2; exit 1; }

# The pid in the pid file, if that process is still this corral serve (a stale file after a reboot may name another
# process, even another corral serve): its command line must be corral serve and its environment must hold this
# CORRAL_DATA_DIR, exactly as start gave it.
running_pid() {
    [ -s "$PID_FILE" ] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "corral.cli serve" || return 1
    [ -r "/proc/$pid/environ" ] || return 1
    tr '\0' '\n' <"/proc/$pid/environ" | grep -qxF "CORRAL_DATA_DIR=$DATA_DIR" || return 1
    echo "$pid"
}

start() {
    [ -x "$PY" ] || die "no .venv: run \`make bootstrap\` first"
    local pid
    if pid="$(running_pid)"; then
        echo "corral is already running (pid $pid) on $URL; log: $LOG_FILE"
        return 0
    fi
    read -r host port < <("$PY" -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1])
print(p.hostname or "127.0.0.1", p.port or 8000)' "$URL")
    mkdir -p -m 0700 "$DATA_DIR"
    touch "$LOG_FILE" && chmod 600 "$LOG_FILE"  # >> keeps an older log's mode: make it private whatever it was
    # setsid: the server outlives this shell and a Ctrl-C in it; it writes its own api-token into DATA_DIR.
    CORRAL_DATA_DIR="$DATA_DIR" setsid "$PY" -m corral.cli serve --host "$host" --port "$port" \
        >>"$LOG_FILE" 2>&1 </dev/null &
    echo $! >"$PID_FILE"
    pid=$!
    # Wait (polling, up to 120 s) until /healthz answers, or the server exits.
    if ! "$PY" - "$URL" "$pid" <<'PY'
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
            if answer.status == 200:
                sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit(1)
PY
    then
        tail -n 20 "$LOG_FILE" >&2
        kill "$pid" 2>/dev/null || true
        rm -f "$PID_FILE"
        die "corral serve did not come up on $URL (log above, whole log in $LOG_FILE)"
    fi
    echo "corral is running (pid $pid) on $URL; log: $LOG_FILE; stop it with \`make stop\`"
}

stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        echo "corral is not running"
        return 0
    fi
    kill -TERM "$pid"
    # A clean shutdown drains warm pools; give it 60 s, then kill it.
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "corral (pid $pid) did not stop within 60 s; killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE"
    echo "corral stopped (pid $pid)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) die "usage: scripts/server.sh start|stop" ;;
esac
