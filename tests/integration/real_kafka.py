"""Shared parts of the tests against a real Apache Kafka broker.

The broker is the one scripts/kafka_broker.sh started (ctest's fixture
real_kafka): its directory holds `bootstrap` (host:port). These tests use
Debian's /usr/bin/python3 with python3-confluent-kafka (a librdkafka client
of its own, for the admin calls and producers the tests drive), kcat as an
independent reader, and the real vipsd binary as a child process.

Every test makes topics and groups of its own (a unique prefix), so that the
tests can share one broker and run beside each other.
"""
import json
import os
import re
import subprocess
import sys
import time
import uuid

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "harness"))

from confluent_kafka import Consumer, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
# The harnesses' failure, check and log (tests/harness/harness.py).
import harness  # noqa: E402
from harness import HarnessFailure as Failure, check, log  # noqa: E402,F401


class Broker:
    """The broker of `directory` (scripts/kafka_broker.sh start DIRECTORY)."""

    def __init__(self, directory):
        self.directory = directory
        path = os.path.join(directory, "bootstrap")
        check(os.path.exists(path),
              "no broker in %s: start it with scripts/kafka_broker.sh start %s "
              "(ctest starts it as the fixture real_kafka)" % (directory, directory))
        with open(path) as f:
            self.bootstrap = f.read().strip()
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        # A unique prefix: tests share the broker.
        self.prefix = "t%s-" % uuid.uuid4().hex[:8]

    def name(self, base):
        return self.prefix + base

    def create_topic(self, base, partitions=1, config=None):
        """Creates PREFIX+base with the given topic configuration; returns its name."""
        name = self.name(base)
        futures = self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1,
                      config=dict(config or {}))], operation_timeout=30)
        try:
            futures[name].result(timeout=60)
        except KafkaException as error:
            if error.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: the test's own, reused
                raise
        # Metadata reaches the broker's own cache a moment after the controller
        # committed the topic: wait until a client sees every partition.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            metadata = self.admin.list_topics(topic=name, timeout=10)
            topic = metadata.topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == partitions:
                return name
            time.sleep(0.1)
        raise Failure("topic %s did not appear in the metadata" % name)

    def tool(self, java_class, *args, timeout=120):
        """One of the broker's own command-line tools (a JVM client)."""
        result = subprocess.run(
            [os.path.join(SOURCE_DIR, "scripts", "kafka_broker.sh"), "tool", self.directory,
             java_class, "--bootstrap-server", self.bootstrap] + list(args),
            capture_output=True, text=True, timeout=timeout)
        check(result.returncode == 0, "%s %s failed (%d): %s" %
              (java_class, " ".join(args), result.returncode, result.stderr[-2000:]))
        return result.stdout

    def delete_records(self, topic, partition, before_offset, work_dir):
        """Moves the log start of topic/partition to before_offset (the
        broker's DeleteRecords, through its own kafka-delete-records tool)."""
        path = os.path.join(work_dir, "delete-%s-%d.json" % (topic, partition))
        with open(path, "w") as f:
            json.dump({"version": 1, "partitions": [
                {"topic": topic, "partition": partition, "offset": before_offset}]}, f)
        return self.tool("org.apache.kafka.tools.DeleteRecordsCommand",
                         "--offset-json-file", path)

    def watermarks(self, topic, partition):
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.name("wm")})
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        finally:
            consumer.close()

    def read_all(self, topic, partitions, isolation="read_committed", timeout=30):
        """Every record of the topic (offset order per partition) as dicts
        with partition, offset, key, value, timestamp type and timestamp,
        read by a plain assigned consumer (no group)."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap,
                             "group.id": self.name("reader-%s" % uuid.uuid4().hex[:6]),
                             "enable.auto.commit": False, "isolation.level": isolation,
                             "enable.partition.eof": True})
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # -2: the log start
        out = []
        done = set(p for p, high in ends.items() if high == 0)
        deadline = time.monotonic() + timeout
        while len(done) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == -191:  # _PARTITION_EOF
                    if message.offset() >= ends[message.partition()]:
                        done.add(message.partition())
                    continue
                if message.error().code() == 1:  # OFFSET_OUT_OF_RANGE: start at the log start
                    continue
                raise Failure("reading %s: %s" % (topic, message.error()))
            stamp_type, stamp = message.timestamp()
            out.append({"partition": message.partition(), "offset": message.offset(),
                        "key": message.key(), "value": message.value(),
                        "timestamp_type": stamp_type, "timestamp": stamp,
                        "headers": dict((k, v) for k, v in (message.headers() or []))})
        consumer.close()
        check(len(done) == partitions, "could not read %s to its end" % topic)
        return out


def kcat_lines(bootstrap, topic, fmt):
    """A topic read by kcat (an independent client), one line per record."""
    result = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning",
                             "-e", "-q", "-X", "fetch.wait.max.ms=10", "-f", fmt],
                            capture_output=True, timeout=120)
    check(result.returncode == 0, "kcat could not read %s: %s" % (topic, result.stderr[-500:]))
    return result.stdout.decode("utf-8", "replace").splitlines()


def kcat_dump(bootstrap, topic):
    """The topic in the reference decoder's kcat format."""
    result = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning",
                             "-e", "-q", "-X", "fetch.wait.max.ms=10",
                             "-f", "vipsd-kcat %p %o %K %S\\n%k\\n%h\\n%s\\n"],
                            capture_output=True, timeout=120)
    check(result.returncode == 0, "kcat could not read %s: %s" % (topic, result.stderr[-500:]))
    return result.stdout


def decoded_releases(bootstrap, topic):
    """(manifest, arrays) of every complete release on the topic, by the
    reference decoder (tools/decode_release.py) from a kcat dump."""
    import decode_release  # tools/decode_release.py (numpy)
    errors = []
    out = [(manifest, arrays) for manifest, arrays, _ in
           decode_release.load_kcat_releases(kcat_dump(bootstrap, topic), errors)]
    check(not errors, "the release topic holds damaged releases: %s" % errors[:3])
    return out


def dead_letters(bootstrap, topic):
    """Headers of every dead letter on the topic (kcat, %h: name=value,...)."""
    out = []
    for line in kcat_lines(bootstrap, topic, "%h\\n"):
        headers = {}
        for name in ("vipsd-reason", "vipsd-source-topic", "vipsd-source-partition",
                     "vipsd-source-offset", "vipsd-payload-omitted", "vipsd-payload-truncated"):
            found = re.search(r"(?:^|,)%s=([^,]*)" % re.escape(name), line)
            if found:
                headers[name] = found.group(1)
        out.append(headers)
    return out


class Vipsd(harness.Vipsd):
    """harness.Vipsd with a clean stop and the log read as text and steps."""

    def stop(self):
        if self.alive():
            self.proc.terminate()
            if self.wait(30) is None:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def tail(self, lines=40):
        return self.log_tail(lines)

    def steps(self):
        """[(step, slot, window)] of every step line so far."""
        return [(int(m.group(1)), int(m.group(2)), int(m.group(3))) for m in
                re.finditer(r"step=(\d+) slot=(\d+) .*?window=(\d+)", self.text())]


def wait_for(condition, timeout, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def run_cases(cases, argv):
    """argv: [case name, --vipsd BINARY, --broker-dir DIR]; runs the case."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(cases))
    parser.add_argument("--vipsd", required=True)
    parser.add_argument("--broker-dir", required=True)
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    import tempfile
    work = args.work_dir or tempfile.mkdtemp(prefix="vipsd-real-kafka-%s-" % args.case)
    os.makedirs(work, exist_ok=True)
    broker = Broker(args.broker_dir)
    log("case %s on Apache Kafka at %s, work directory %s" % (args.case, broker.bootstrap, work))
    try:
        cases[args.case](broker, args.vipsd, work)
    except Failure as failure:
        print("FAILED: %s" % failure, flush=True)
        print("0 passed, 1 failed", flush=True)
        return 1
    print("1 passed, 0 failed", flush=True)
    return 0
