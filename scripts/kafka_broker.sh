#!/usr/bin/env bash
# A real single-node Apache Kafka broker (KRaft, broker and controller in one
# JVM) on loopback ports, for the test suite. The broker's jars come from
# Maven Central (scripts/kafka/pom.xml names the version) into a cache
# outside the tracked tree; after the first fetch nothing is downloaded.
#
#   scripts/kafka_broker.sh fetch          copy the jars into the cache (once)
#   scripts/kafka_broker.sh start DIR      fetch if needed, stop a broker left
#                                          running from DIR, format a fresh
#                                          DIR/data, start the broker on free
#                                          loopback ports, wait until it
#                                          answers; DIR/bootstrap: host:port
#   scripts/kafka_broker.sh stop DIR       stop it (SIGTERM, then SIGKILL)
#   scripts/kafka_broker.sh kill DIR       SIGKILL, as a crash would
#   scripts/kafka_broker.sh restart DIR    stop, then start again on the same
#                                          ports and data (a broker restart)
#   scripts/kafka_broker.sh run DIR CMD... start, run CMD with
#                                          VIPSD_KAFKA_BOOTSTRAP and
#                                          VIPSD_KAFKA_BROKER_DIR set, stop
#   scripts/kafka_broker.sh tool DIR CLASS ARGS...
#                                          run one of the broker's own tools
#                                          (e.g. org.apache.kafka.tools.TopicCommand)
#   scripts/kafka_broker.sh classpath      print the broker's classpath
#
# Environment: VIPSD_KAFKA_CACHE (default ~/.cache/vipsd/kafka-VERSION),
# JAVA (default java), VIPSD_KAFKA_HEAP (default 512m),
# VIPSD_KAFKA_START_TIMEOUT seconds (default 90).
# The broker's log is DIR/broker.log; DIR/start_seconds holds the time the
# last start took until the broker answered.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pom=$here/kafka/pom.xml
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
cache=${VIPSD_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vipsd/kafka-$version}
java=${JAVA:-java}
heap=${VIPSD_KAFKA_HEAP:-512m}
start_timeout=${VIPSD_KAFKA_START_TIMEOUT:-90}

die() { echo "kafka_broker: $*" >&2; exit 1; }

fetch() {
  # The stamp names the pom's digest: a changed pom fetches again.
  local digest
  digest=$(sha256sum "$pom" | cut -d' ' -f1)
  if [[ -f "$cache/fetched" && "$(cat "$cache/fetched")" == "$digest" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (scripts/setup.sh installs maven)"
  command -v "$java" >/dev/null || die "$java not found (scripts/setup.sh installs a JRE)"
  echo "kafka_broker: fetching Apache Kafka $version from Maven Central into $cache" >&2
  rm -rf "$cache.tmp"
  mkdir -p "$cache.tmp"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$cache.tmp/libs" >&2 ||
    die "maven could not fetch the broker (see above)"
  ls "$cache.tmp/libs"/kafka_2.13-"$version".jar >/dev/null ||
    die "maven fetched no kafka_2.13-$version.jar"
  echo "$digest" >"$cache.tmp/fetched"
  rm -rf "$cache"
  mv "$cache.tmp" "$cache"
}

classpath() { echo "$cache/libs/*"; }

free_port() {
  # A port the kernel hands out now; the broker binds it a moment later.
  /usr/bin/env python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Serial GC and the C1 compiler: a test broker on two cores starts in
# seconds and leaves the CPU to the tests.
java_opts=(-Xms128m -Xmx"$heap" -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  -Djava.awt.headless=true -Dorg.slf4j.simpleLogger.defaultLogLevel=warn
  -Dorg.slf4j.simpleLogger.showDateTime=true)
java_cmd() { "$java" "${java_opts[@]}" -cp "$(classpath)" "$@"; }

alive() {
  local dir=$1
  [[ -f "$dir/pid" ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null
}

write_config() {
  local dir=$1 port=$2 controller_port=$3
  cat >"$dir/server.properties" <<EOF
# Written by scripts/kafka_broker.sh: a single-node test broker.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
# One node: every internal topic has one replica.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests join groups often: no initial rebalance delay, and session timeouts
# down to 1 s (the tests' daemons notice a dead member within seconds; the
# broker's default minimum is 6 s).
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# Retention tests: segments are checked every second and deleted at once.
log.retention.check.interval.ms=1000
log.segment.delete.delay.ms=0
log.cleaner.backoff.ms=1000
# Tests that hold a transaction open abort it after this many ms at most.
transaction.max.timeout.ms=900000
EOF
}

# launch DIR fresh|again: a fresh broker, or the one whose ports and data DIR holds.
launch() {
  local dir=$1 mode=$2
  fetch
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local port controller_port
  if [[ "$mode" == again ]]; then
    [[ -f "$dir/server.properties" && -d "$dir/data" ]] || die "no broker to restart in $dir"
    if alive "$dir"; then die "a broker already runs from $dir (pid $(cat "$dir/pid"))"; fi
    port=$(sed -n 's/^advertised.listeners=PLAINTEXT:\/\/127.0.0.1://p' "$dir/server.properties")
    controller_port=$(sed -n 's/^controller.quorum.voters=1@127.0.0.1://p' "$dir/server.properties")
  else
    # A broker left running from DIR (an interrupted test run) goes first.
    stop "$dir"
    rm -f "$dir/broker.log" "$dir/bootstrap"
    port=$(free_port)
    controller_port=$(free_port)
    while [[ "$controller_port" == "$port" ]]; do controller_port=$(free_port); done
    rm -rf "$dir/data"
    write_config "$dir" "$port" "$controller_port"
    local cluster_id
    cluster_id=$(java_cmd kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
    java_cmd kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" \
      >"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; die "formatting $dir/data failed"; }
  fi
  local t0 t1
  t0=$(date +%s.%N)
  # setsid and closed descriptors: the broker outlives this script (ctest
  # fixtures start it in one test and stop it in another).
  setsid "$java" "${java_opts[@]}" -cp "$(classpath)" kafka.Kafka "$dir/server.properties" </dev/null >>"$dir/broker.log" 2>&1 &
  echo $! >"$dir/pid"
  echo "127.0.0.1:$port" >"$dir/bootstrap"
  local deadline=$((SECONDS + start_timeout))
  until kcat -b "127.0.0.1:$port" -L -m 2 >/dev/null 2>&1; do
    if ! alive "$dir"; then
      tail -20 "$dir/broker.log" >&2
      die "the broker exited during start (log: $dir/broker.log)"
    fi
    if ((SECONDS >= deadline)); then
      tail -20 "$dir/broker.log" >&2
      stop "$dir"
      die "the broker did not answer within ${start_timeout}s (log: $dir/broker.log)"
    fi
    sleep 0.2
  done
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }' >"$dir/start_seconds"
  echo "kafka_broker: Apache Kafka $version answers at 127.0.0.1:$port" \
    "(started in $(cat "$dir/start_seconds") s; pid $(cat "$dir/pid"), log $dir/broker.log)"
}

stop() {
  local dir=$1 signal=${2:-TERM}
  [[ -f "$dir/pid" ]] || return 0
  local pid
  pid=$(cat "$dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -"$signal" "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "kafka_broker: pid $pid ignored SIGTERM for 30 s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
  fi
  rm -f "$dir/pid"
}

cmd=${1:-}
case "$cmd" in
  fetch) fetch ;;
  classpath) fetch; classpath ;;
  start) [[ $# -eq 2 ]] || die "usage: start DIR"; launch "$2" fresh ;;
  stop) [[ $# -eq 2 ]] || die "usage: stop DIR"; stop "$2" ;;
  kill) [[ $# -eq 2 ]] || die "usage: kill DIR"; stop "$2" KILL ;;
  restart) [[ $# -eq 2 ]] || die "usage: restart DIR"; stop "$2"; launch "$2" again ;;
  tool)
    [[ $# -ge 3 ]] || die "usage: tool DIR CLASS ARGS..."
    fetch
    shift 2
    java_cmd "$@"
    ;;
  run)
    [[ $# -ge 3 ]] || die "usage: run DIR CMD..."
    dir=$2
    shift 2
    launch "$dir" fresh
    trap 'stop "$dir"' EXIT
    VIPSD_KAFKA_BOOTSTRAP=$(cat "$dir/bootstrap") VIPSD_KAFKA_BROKER_DIR=$(cd "$dir" && pwd) "$@"
    ;;
  *) die "usage: scripts/kafka_broker.sh fetch|start DIR|stop DIR|kill DIR|restart DIR|run DIR CMD...|tool DIR CLASS ARGS...|classpath" ;;
esac
