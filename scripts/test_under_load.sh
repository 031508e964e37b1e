#!/usr/bin/env bash
# README command 2 (the test suite) beside N busy loops: proves that no test depends on how fast the machine is.
# Starts N CPU-bound loops (default 2, one per core on a 2-core machine), runs the suite, kills the loops on any exit
# (trap), prints pytest's summary line and the wall time, and exits with pytest's status (0: the suite passed).
#
#   bash scripts/test_under_load.sh                      # 2 busy loops, .venv/bin/python -m pytest -q
#   bash scripts/test_under_load.sh 4                    # 4 busy loops (or N=4 bash scripts/test_under_load.sh)
#   bash scripts/test_under_load.sh 2 tests/servers      # extra arguments go to pytest (a subset of the suite)
#   PYTHON=/path/to/venv/bin/python bash scripts/test_under_load.sh   # the suite's Python (default .venv/bin/python)
#
# The full log is kept in a temporary file whose path is printed at the end.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

N=${N:-2}
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    N=$1
    shift
fi
if ! [[ $N =~ ^[0-9]+$ ]]; then
    echo "test_under_load: N must be a whole number of busy loops, got '$N'" >&2
    exit 2
fi
PY=${PYTHON:-$repo/.venv/bin/python}
if [[ ! -x $PY ]]; then
    echo "test_under_load: no Python at $PY (run scripts/setup.sh, or set PYTHON=)" >&2
    exit 2
fi

loops=()
pytest_pid=
log=$(mktemp "${TMPDIR:-/tmp}/test_under_load.XXXXXX.log")
stop_all() {
    local pid
    [[ -n $pytest_pid ]] && kill "$pytest_pid" 2>/dev/null
    for pid in "${loops[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${loops[@]}"; do
        wait "$pid" 2>/dev/null
    done
    loops=()
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for ((i = 0; i < N; i++)); do
    # a pure-CPU loop (no I/O): `yes` writing into /dev/null keeps one core busy
    yes >/dev/null &
    loops+=("$!")
done
echo "test_under_load: $N busy loop(s) (pids ${loops[*]:-none}), load before: $(cut -d' ' -f1-3 /proc/loadavg)"

t0=$(date +%s)
# pytest and the printer of its log run in the background, so that a signal to this script is handled at once
"$PY" -m pytest -q "$@" >"$log" 2>&1 &
pytest_pid=$!
tail -n +1 -f --pid="$pytest_pid" "$log" &
printer=$!
wait "$pytest_pid"
status=$?
pytest_pid=
wait "$printer"
wall=$(($(date +%s) - t0))
stop_all

summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped|deselected)|^(=+ )?no tests ran' "$log" | tail -n 1)
echo "test_under_load: summary: ${summary:-<no pytest summary line; see the log>}"
echo "test_under_load: wall ${wall} s ($((wall / 60)) min $((wall % 60)) s) beside $N busy loop(s); pytest exit $status; log $log"
exit "$status"
