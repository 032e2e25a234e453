#!/usr/bin/env bash
# Server time of one grant, by how it is asked for: the figures behind BENCHMARKS.md, "Where the
# server's time goes". Starts its own redis-server (pinned to CPU 0, the client tools to CPU 1),
# sends 200,000 grants on fresh keys per variant, and prints the server's CPU per grant
# (`INFO cpu`, which includes reading requests and writing replies) and the time per call of
# the top-level command (`INFO commandstats`). Run from the repository root:
#
#     benches/server_costs.sh [rounds]     # default 3 rounds, variants alternating
set -euo pipefail

rounds=${1:-3}
n=200000
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
taskset -c 0 redis-server --port "$port" --save '' --appendonly no --dir "$dir" \
  --daemonize yes --logfile "$dir/log"
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
cli() { redis-cli -p "$port" "$@"; }

acquire_sha=$(cli SCRIPT LOAD "$(cat lock-runtime/scripts/write/acquire.lua)")
# The lock side of a grant alone, in a script: what any script-based grant pays at least.
set_sha=$(cli SCRIPT LOAD "if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end return 1")

# One file of requests per variant (RESP, fresh random keys), sent with `redis-cli --pipe`.
python3 - "$dir" "$n" "$acquire_sha" "$set_sha" <<'EOF'
import random, sys
out, n, acquire, set_only = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def resp(*args):
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        a = str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(parts)
owner = "0123456789abcdef0123456789abcdef"
variants = {
    "set-nx-px": lambda k: resp("SET", k, owner, "NX", "PX", 10000),
    "set-nx-px-get": lambda k: resp("SET", k, owner, "NX", "PX", 10000, "GET"),
    "multi-set-time-exec": lambda k: resp("MULTI") + resp("SET", k, owner, "NX", "PX", 10000, "GET")
        + resp("TIME") + resp("EXEC"),
    "script-set-only": lambda k: resp("EVALSHA", set_only, 1, k, owner, 10000),
    "script-clock-token": lambda k: resp("EVALSHA", acquire, 2, k, k + ":w", owner, 10000, "clock", 100, 0),
    "script-counter-token": lambda k: resp("EVALSHA", acquire, 3, "{%s}" % k, "{%s}:w" % k, "{%s}:f" % k,
        owner, 10000, 10000, 100, 0),
}
for name, make in variants.items():
    with open(f"{out}/{name}.resp", "wb") as f:
        for _ in range(n):
            f.write(make("k:%d" % random.randrange(10**15)))
EOF

cpu() { cli INFO cpu | awk -F: '/used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'; }
echo "redis $(redis-server --version | awk '{print $3}'), $n grants per variant, server on CPU 0"
for round in $(seq 1 "$rounds"); do
  for variant in set-nx-px set-nx-px-get multi-set-time-exec script-set-only script-clock-token script-counter-token; do
    cli FLUSHALL >/dev/null
    cli CONFIG RESETSTAT >/dev/null
    before=$(cpu)
    taskset -c 1 redis-cli -p "$port" --pipe <"$dir/$variant.resp" >/dev/null
    after=$(cpu)
    per_call=$(cli INFO commandstats | awk -F'[=,]' '/^cmdstat_(set|exec|evalsha):/ { split($0, a, ":"); c[a[1]] = $6 } END { if ("cmdstat_evalsha" in c) print c["cmdstat_evalsha"]; else if ("cmdstat_exec" in c) print c["cmdstat_exec"]; else print c["cmdstat_set"] }')
    printf 'round %s  %-22s server CPU per grant %6.2f us   top-level usec_per_call %s\n' \
      "$round" "$variant" "$(echo "($after - $before) * 1000000 / $n" | bc -l)" "$per_call"
  done
done
