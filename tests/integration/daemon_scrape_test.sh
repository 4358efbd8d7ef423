#!/usr/bin/env bash
# A real Prometheus scrapes the real vipsd daemon (embedded Kafka fed with
# the bundled demo corpus) and PromQL checks what it exposes, including the
# alert rules' evaluation against it.
#   daemon_scrape_test.sh VIPSD_BINARY SOURCE_DIR PROMETHEUS PROMTOOL
set -euo pipefail
vipsd=$1 source_dir=$2 prometheus=$3 promtool=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
demo="$source_dir/config/examples/demo"
# The demo configuration, with absolute paths, a fixed metrics port, and
# halt (not exit) at the ceiling so that the endpoint stays up.
sed -e "s|vocabulary: demo/vocab.txt|vocabulary: $demo/vocab.txt|" \
    -e "s|demo_corpus: demo/corpus.jsonl|demo_corpus: $demo/corpus.jsonl|" \
    -e "s|mirror_directory: .*|mirror_directory: $work/releases|" \
    -e "s|  directory: ../../out/demo/state|  directory: $work/state|" \
    -e "s|listen: 127.0.0.1:0 .*|listen: 127.0.0.1:$port|" \
    -e "s|on_ceiling: exit .*|on_ceiling: halt|" \
    -e "s|interval_seconds: 0.15 .*|interval_seconds: 0.05|" \
    -e "s|start_delay_seconds: [0-9.]* .*|start_delay_seconds: 0|" \
    "$source_dir/config/examples/demo.yaml" > "$work/vipsd.yaml"
# Untimed: this test is about the metrics, and under ASan beside other tests
# the demo's worst-case step can need more CPU than its slot (a refusal
# integration.check_config_step_time covers).
"$vipsd" --config "$work/vipsd.yaml" --check-config --no-step-time-check
exec "$source_dir/tests/integration/prometheus_scrape_test.sh" \
  --prometheus "$prometheus" --promtool "$promtool" --timeout 60 \
  --start "'$vipsd' --config '$work/vipsd.yaml' --no-step-time-check" \
  --target "127.0.0.1:$port" \
  --rules "$source_dir/daemon/prometheus/vipsd_alerts.yml" \
  --expect 'vipsd_steps_total > 0' \
  --expect-value 'vipsd_records_consumed_total{topic="demo-documents"}' 5004 \
  --expect-value 'vipsd_records_rejected_total{reason="invalid_json"}' 1 \
  --expect-value 'vipsd_records_rejected_total{reason="bad_text"}' 1 \
  --expect-value 'vipsd_pool_records' 5001 \
  --expect-value 'vipsd_privacy_epsilon_ceiling' 4 \
  --expect-value 'vipsd_privacy_accounting_mode{mode="global"}' 1 \
  --expect 'vipsd_privacy_epsilon_spent > 0' \
  --expect 'vipsd_releases_published_total > 0' \
  --expect 'vipsd_ledger_commits_total > 0' \
  --expect 'vipsd_build_info{model_type="lda"} == 1' \
  --expect 'absent(ALERTS{alertname="VipsdReleasesFailing"})' \
  --expect 'absent(vipsd_step_duration_seconds_count)' \
  --expect 'vipsd_slot > 0'
