#!/usr/bin/env bash
# A real Prometheus server scrapes a vipsd metrics endpoint; PromQL queries
# against the server then check what arrived.
#
#   prometheus_scrape_test.sh [options]
#     --start CMD           start CMD (run by bash, in its own process group,
#                           stopped on exit); unless --target is given, the
#                           first line CMD prints on stdout is the port it
#                           serves /metrics on, at 127.0.0.1
#     --target HOST:PORT    the endpoint to scrape (started by --start or
#                           already running)
#     --rules FILE          alert rules to load (checked: every rule must
#                           evaluate without error)
#     --expect-value QUERY VALUE
#                           QUERY must return exactly one sample equal to
#                           VALUE (relative tolerance 1e-9); repeatable
#     --expect EXPR         EXPR must return at least one sample; repeatable
#                           (e.g. 'ALERTS{alertname="X",alertstate="firing"}'
#                           or 'absent(ALERTS{alertname="Y"})')
#     --job NAME            scrape job name (default vipsd: the rules expect it)
#     --timeout SECONDS     overall deadline for every wait (default 30;
#                           a passing run takes about 10 s)
#     --prometheus BIN, --promtool BIN
#
# Also runs `promtool check metrics` on the endpoint's exposition. Exit 0 on
# success, 1 on failure (with the server's log), 2 on bad usage. Every
# process started here is stopped on every exit path.
#
# The lead's daemon can be checked the same way, e.g.
#   prometheus_scrape_test.sh --start "vipsd --config demo.yaml" \
#     --target 127.0.0.1:19464 --expect 'vipsd_steps_total > 0'
set -euo pipefail

prometheus=prometheus
promtool=promtool
start_cmd=""
target=""
rules=""
job=vipsd
timeout=30
expects=()
expect_queries=()
expect_values=()

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --start) start_cmd=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --rules) rules=$(realpath "$2"); shift 2 ;;
    --expect) expects+=("$2"); shift 2 ;;
    --expect-value) expect_queries+=("$2"); expect_values+=("$3"); shift 3 ;;
    --job) job=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --prometheus) prometheus=$2; shift 2 ;;
    --promtool) promtool=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "prometheus_scrape_test: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -n "$start_cmd" || -n "$target" ]] || { echo "need --start or --target" >&2; usage; }
for tool in "$prometheus" "$promtool"; do
  command -v "$tool" >/dev/null ||
    { echo "FAIL: '$tool' not found (Debian package 'prometheus'; run scripts/setup.sh)" >&2; exit 1; }
done
python=/usr/bin/python3
[[ -x $python ]] || python=python3

tmp=$(mktemp -d)
process_groups=()
cleanup() {
  local pgid
  for pgid in "${process_groups[@]}"; do
    kill -TERM -- "-$pgid" 2>/dev/null || true
  done
  for pgid in "${process_groups[@]}"; do
    for _ in $(seq 50); do kill -0 -- "-$pgid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pgid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

deadline=$((SECONDS + timeout))
fail() {
  echo "FAIL: $*" >&2
  if [[ -s "$tmp/prometheus.log" ]]; then echo "--- prometheus log (tail)" >&2; tail -n 20 "$tmp/prometheus.log" >&2; fi
  if [[ -s "$tmp/target.err" ]]; then echo "--- target stderr (tail)" >&2; tail -n 20 "$tmp/target.err" >&2; fi
  exit 1
}

# Starts "$@" in the background as the leader of a new process group (so that
# cleanup stops its children too); prints the pid (= process group id).
spawn() {
  local out=$1 err=$2
  shift 2
  setsid "$@" > "$out" 2> "$err" < /dev/null &
  echo $!
}

# HTTP and JSON through Python's standard library (no curl needed). The
# helper must not be called http.py: it would shadow the http package.
cat > "$tmp/promql_helper.py" <<'PY'
import json, math, socket, sys, time, urllib.parse, urllib.request

def get(url):
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.read().decode()

def query(base, expr):
    """[(value, labels)] of an instant query; raises on an API error."""
    body = json.loads(get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    if body.get("status") != "success":
        raise RuntimeError("query failed: " + json.dumps(body))
    result = body["data"]["result"]
    if body["data"]["resultType"] == "scalar":
        result = [{"metric": {}, "value": result}]
    return [(float(s["value"][1]), s["metric"]) for s in result]

def value_is(base, expr, expected):
    samples = query(base, expr)
    ok = len(samples) == 1 and math.isclose(samples[0][0], expected, rel_tol=1e-9, abs_tol=1e-12)
    return ok, "got %s" % (samples or "no sample")

def nonempty(base, expr):
    samples = query(base, expr)
    return bool(samples), "got %s" % (samples or "no sample")

def rules_ok(base):
    groups = json.loads(get(base + "/api/v1/rules"))["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    bad = [r["name"] + ": " + r.get("health", "?") + " " + r.get("lastError", "")
           for r in rules if r.get("health") != "ok"]
    return bool(rules) and not bad, "%d rules, not ok: %s" % (len(rules), bad)

def poll(deadline, description, check, *args):
    while True:
        try:
            ok, detail = check(*args)
        except Exception as e:  # server not answering yet, bad query, ...
            ok, detail = False, repr(e)
        if ok:
            print("ok: " + description, flush=True)
            return
        if time.time() > deadline:
            sys.exit("FAIL: %s (%s)" % (description, detail))
        time.sleep(0.2)

mode, args = sys.argv[1], sys.argv[2:]
if mode == "get":  # get URL: print the body
    sys.stdout.write(get(args[0]))
elif mode == "free_port":  # a port that was free a moment ago
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])
elif mode == "check":  # check BASE DEADLINE JOB RULES(0|1) [value EXPR V | nonempty EXPR]...
    base, deadline, job, with_rules = args[0], float(args[1]), args[2], args[3] == "1"
    poll(deadline, 'target scraped: up{job="%s"} == 1' % job, value_is, base,
         'up{job="%s"}' % job, 1.0)
    if with_rules:
        poll(deadline, "every alert rule evaluates without error", rules_ok, base)
    rest = args[4:]
    while rest:
        if rest[0] == "value":
            poll(deadline, "%s == %s" % (rest[1], rest[2]), value_is, base, rest[1], float(rest[2]))
            rest = rest[3:]
        else:
            poll(deadline, "%s returns a sample" % rest[1], nonempty, base, rest[1])
            rest = rest[2:]
PY
http() { "$python" "$tmp/promql_helper.py" "$@"; }

# ---- The target -----------------------------------------------------------------
if [[ -n "$start_cmd" ]]; then
  target_pid=$(spawn "$tmp/target.out" "$tmp/target.err" bash -c "exec $start_cmd")
  process_groups+=("$target_pid")
  if [[ -z "$target" ]]; then
    port=""
    while [[ -z "$port" ]]; do
      [[ $SECONDS -lt $deadline ]] || fail "target did not print its port within ${timeout}s"
      kill -0 "$target_pid" 2>/dev/null || fail "target exited before printing its port"
      port=$(head -n 1 "$tmp/target.out" | grep -E '^[0-9]+$' || true)
      [[ -n "$port" ]] || sleep 0.05
    done
    target="127.0.0.1:$port"
  fi
fi
until http get "http://$target/metrics" > "$tmp/exposition.txt" 2>/dev/null; do
  [[ $SECONDS -lt $deadline ]] || fail "no /metrics at $target within ${timeout}s"
  sleep 0.1
done
if ! "$promtool" check metrics < "$tmp/exposition.txt" > "$tmp/lint.txt" 2>&1; then
  cat "$tmp/lint.txt" >&2
  fail "promtool check metrics rejects the exposition of $target"
fi
echo "ok: $target serves /metrics; promtool check metrics is clean"

# ---- The server -----------------------------------------------------------------
{
  echo "global:"
  echo "  scrape_interval: 1s"
  echo "  scrape_timeout: 1s"
  echo "  evaluation_interval: 1s"
  if [[ -n "$rules" ]]; then echo "rule_files: [\"$rules\"]"; fi
  echo "scrape_configs:"
  echo "  - job_name: $job"
  echo "    static_configs:"
  echo "      - targets: [\"$target\"]"
} > "$tmp/prometheus.yml"
"$promtool" check config "$tmp/prometheus.yml" > "$tmp/check_config.txt" 2>&1 ||
  { cat "$tmp/check_config.txt" >&2; fail "promtool check config"; }

base=""
for attempt in 1 2 3; do  # the free port may be taken between probe and bind
  server_port=$(http free_port)
  server_pid=$(spawn "$tmp/prometheus.log" "$tmp/prometheus.log" "$prometheus" \
    --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
    --web.listen-address="127.0.0.1:$server_port" --log.level=warn)
  process_groups+=("$server_pid")
  while kill -0 "$server_pid" 2>/dev/null && [[ $SECONDS -lt $deadline ]]; do
    if http get "http://127.0.0.1:$server_port/-/ready" > /dev/null 2>&1; then
      base="http://127.0.0.1:$server_port"
      break 2
    fi
    sleep 0.1
  done
  [[ $SECONDS -lt $deadline ]] || break
  echo "prometheus did not start on port $server_port (attempt $attempt)" >&2
done
[[ -n "$base" ]] || fail "prometheus did not become ready"
echo "ok: prometheus ready at $base"

# ---- Checks (each retried until the deadline) --------------------------------------
# The first scrape comes up to ~5 s after start-up: Prometheus applies newly
# discovered targets on a 5-second tick.
check_args=()
for i in "${!expect_queries[@]}"; do
  check_args+=(value "${expect_queries[$i]}" "${expect_values[$i]}")
done
for expr in "${expects[@]}"; do
  check_args+=(nonempty "$expr")
done
http check "$base" "$(($(date +%s) + deadline - SECONDS))" "$job" "$([[ -n "$rules" ]] && echo 1 || echo 0)" \
  "${check_args[@]}" || fail "an expectation did not hold within ${timeout}s"
echo "PASS: prometheus scraped $target and every expectation held (${SECONDS}s)"
