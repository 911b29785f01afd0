#!/usr/bin/env bash
# Run every bench once, with modest durations (about 20 minutes on 2 cores), and write
# bench/RESULTS.md: one table of every figure, the machine and the date, then what
# each bench printed. A bench that fails is listed there; the others still run.
#
#   bench/run_all.sh            # uses .venv/bin/python if present, else python3
#   PYTHON=/path/to/python bench/run_all.sh
#
# The peers come from the `bench` extra: pip install -e '.[bench]', and mcp-hub from
# npm: npm ci --prefix bench/npm. A peer that is not installed is skipped and named
# in the output.
set -uo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
work=$(mktemp -d /tmp/capd-run-all-XXXXXX)
trap 'rm -rf "$work"' EXIT
results="$work/results.jsonl"
: > "$results"

busy_pct() {  # percent of all cores busy over the next 2 s
    local a b
    read -r -a a < <(head -1 /proc/stat)
    sleep 2
    read -r -a b < <(head -1 /proc/stat)
    local busy=0 total=0 i
    for i in 1 2 3 4 5 6 7 8; do
        total=$((total + b[i] - a[i]))
        [ "$i" -ne 4 ] && [ "$i" -ne 5 ] && busy=$((busy + b[i] - a[i]))
    done
    echo $((100 * busy / (total > 0 ? total : 1)))
}

# On a shared machine, wait (at most 2 minutes) for other work to quiet down.
waited=0
while [ "$waited" -lt 120 ] && [ "$(busy_pct)" -gt 25 ]; do
    waited=$((waited + 2))
done
echo "machine busy $(busy_pct) % of all cores at the start (waited ${waited} s for it to quiet)"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)

step=0
run() {  # run NAME TIMEOUT_S ARGS...: one bench, its output to the log and the terminal
    local name=$1 limit=$2
    shift 2
    step=$((step + 1))
    local log
    log=$(printf '%s/%02d-%s.out' "$work" "$step" "$name")
    local t0=$SECONDS
    echo "== $name: $*"
    timeout --kill-after=10 "$limit" "$PYTHON" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    echo "($name took $((SECONDS - t0)) s, exit $rc)" | tee -a "$log"
    if [ "$rc" -ne 0 ]; then
        echo "$name exited $rc (after $((SECONDS - t0)) s; timeout ${limit} s)" >> "$work/failed.txt"
    fi
}

run peers 240 bench/peers.py --seconds 2 --rounds 3 --results "$results"
run dispatch 180 bench/dispatch.py --seconds 2 --rounds 3 --results "$results"
run mcp_bridge 120 bench/mcp_bridge.py --rounds 5 --results "$results"
run mcp_large 180 bench/mcp_large.py --rounds 2 --results "$results"
run mcp_peers 360 bench/mcp_peers.py --rounds 5 --calls 190 --starts 3 --results "$results"
run queue 240 bench/queue.py --jobs 1024 --rounds 3 --results "$results"
run build 120 bench/build.py --repeat 3 --results "$results"
run startup 120 bench/startup.py --rounds 5 --results "$results"
run search 120 bench/search.py --results "$results"
# A real PostgreSQL server (Debian's postgresql; initdb runs as the postgres user, so root):
# the shared queue beside procrastinate and the server's own floor.
run pg_queue 420 bench/pg_queue.py --rounds 3 --results "$results"
# The benches below print their own figures (no rows in the table): their output
# is kept under "What each bench printed".
run reload_health 120 bench/reload_health.py --rounds 3
run http_abuse 180 bench/http_abuse.py
run crash 180 bench/crash.py --kills 20
run soak 300 bench/soak.py --minutes 4 --window-s 30  # the long run: --minutes 120

"$PYTHON" bench/_report.py --results "$results" --logs "$work" \
    --seconds $(($(date +%s) - started)) --load-before "$load_before"
