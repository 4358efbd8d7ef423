#!/usr/bin/env bash
# ThreadSanitizer (clang) on the concurrent code: builds build-tsan with only
# the test targets whose code runs threads — the daemon (clock, ingest and
# step threads, reloads, the ledger retry; the ingest thread's staging and
# cut targets; shared work's worker and coordinator), the metrics registry under
# concurrent scrapes, the step driver's E-step workers and chunk merges, the
# LDA M-step's column threads, and the Kafka source and producer (librdkafka's own
# threads; its internal races are suppressed by scripts/tsan.supp, since it
# is not built with TSan) — and runs them. A data race fails the run.
# The whole suite under gcc's TSan: VIPSD_SANITIZE=thread scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(daemon_test metrics_test kafka_source_test kafka_producer_test step_driver_test lda_test
         fixed_schedule_test ingest_test worker_test coordinator_test)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVIPSD_SANITIZE=thread -DVIPSD_BUILD_BENCHMARKS=OFF "${launcher[@]}" >/dev/null
ninja -C build-tsan -j"${VIPSD_JOBS:-$(nproc)}" "${targets[@]}"
export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$PWD/scripts/tsan.supp halt_on_error=1}
scripts/ctest_run.sh build-tsan -j"$(nproc)" \
  -R '^(DaemonTest|MetricsTest|KafkaSourceTest|KafkaProducerTest|Protocols/KafkaSource|StepDriverTest|LdaModelTest|FixedScheduleAccountantTest.Prefetch|IngestTest|WorkerTest|CoordinatorTest)'
