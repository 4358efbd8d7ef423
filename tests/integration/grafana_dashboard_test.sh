#!/usr/bin/env bash
# daemon/grafana/vipsd.json is valid JSON with a Grafana dashboard's shape,
# every query is PromQL that promtool accepts (each becomes a recording rule
# of a throwaway rules file: `promtool check rules` parses it), and every
# vipsd_* metric it reads is one the daemon exports (the exposition of a
# real Metrics registry, served by metrics_test_server).
# Usage: grafana_dashboard_test.sh METRICS_TEST_SERVER DASHBOARD PROMTOOL
set -euo pipefail
server=$1
dashboard=$2
promtool=$3
work=$(mktemp -d)
pid=""
trap '[[ -n $pid ]] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$server" >"$work/server.out" &
pid=$!
for _ in $(seq 100); do [[ -s "$work/server.out" ]] && break; sleep 0.1; done
port=$(head -1 "$work/server.out")
[[ -n "$port" ]] || fail "metrics_test_server printed no port"
curl -sf "http://127.0.0.1:$port/metrics" >"$work/exposition" || fail "cannot scrape"

python3 - "$dashboard" "$work/exposition" "$work/rules.yml" <<'PY' || exit 1
import json, re, sys
dashboard_path, exposition_path, rules_path = sys.argv[1:]
try:
    dash = json.load(open(dashboard_path))
except ValueError as e:
    sys.exit("FAIL: %s is not valid JSON: %s" % (dashboard_path, e))
for key in ("title", "uid", "panels", "templating", "schemaVersion"):
    if key not in dash:
        sys.exit("FAIL: dashboard has no %r" % key)
exported = set()
for line in open(exposition_path):
    m = re.match(r"# TYPE (\S+) (\S+)", line)
    if m:
        name, kind = m.groups()
        exported.add(name)
        if kind == "histogram":
            exported.update({name + "_bucket", name + "_sum", name + "_count"})
exprs = []
for panel in dash["panels"]:
    if panel.get("type") == "row":
        continue
    if not panel.get("targets"):
        sys.exit("FAIL: panel %r has no queries" % panel.get("title"))
    for target in panel["targets"]:
        exprs.append((panel["title"], target["expr"]))
for variable in dash["templating"]["list"]:
    if variable.get("type") == "query":
        exprs.append(("variable " + variable["name"],
                      re.sub(r"^label_values\((.*), *\w+\)$", r"\1", variable["definition"])))
missing = set()
for title, expr in exprs:
    for name in re.findall(r"\bvipsd_[a-z0-9_]+", expr):
        if name not in exported:
            missing.add((title, name))
if missing:
    sys.exit("FAIL: the dashboard reads metrics the daemon does not export: %s" % sorted(missing))
needed = {"vipsd_privacy_epsilon_spent", "vipsd_privacy_epsilon_ceiling", "vipsd_steps_total",
          "vipsd_release_publish_duration_seconds_bucket", "vipsd_releases_failed_total",
          "vipsd_consumer_lag_records", "vipsd_dead_letters_published_total"}
used = {n for _, e in exprs for n in re.findall(r"\bvipsd_[a-z0-9_]+", e)}
if needed - used:
    sys.exit("FAIL: the dashboard does not show %s" % sorted(needed - used))
if not any("predict_linear(vipsd_privacy_epsilon_spent" in e for _, e in exprs):
    sys.exit("FAIL: no budget forecast (predict_linear) panel")
with open(rules_path, "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, expr) in enumerate(exprs):
        # Grafana variables become plain values so that PromQL parses.
        expr = expr.replace('"$instance"', '".*"').replace("$instance", ".*")
        out.write("      - record: dashboard:query_%d\n        expr: %s\n" % (i, json.dumps(expr)))
print("dashboard: %d panels, %d queries, every metric exported" % (len(dash["panels"]), len(exprs)))
PY
"$promtool" check rules "$work/rules.yml" >"$work/promtool.out" 2>&1 ||
  { cat "$work/promtool.out"; fail "a dashboard query is not valid PromQL"; }
echo "every dashboard query parses (promtool)"
