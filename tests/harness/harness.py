"""Shared parts of vipsd's robustness harnesses (kill_harness.py,
broker_fault_harness.py): a mock Kafka cluster in its own process
(vipsd-mock-kafka), the real vipsd binary as a child process, kcat as the
independent client, tools/decode_release.py to read the release topic and
`vipsd status --json` to read the state directory.

Only the Python standard library and, where releases are read, the reference
decoder's numpy (imported then: bench/shared_work_bench.py uses MockKafka on
machines without numpy).
"""
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))


def _decode_release():
    import decode_release  # noqa: E402  (tools/decode_release.py; needs numpy)
    return decode_release

DELTA = 1e-5
VOCABULARY = ["apple", "banana", "cherry", "date", "elder", "fig"]


class HarnessFailure(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise HarnessFailure(message)


def log(message):
    print("[%8.2f] %s" % (time.monotonic() - _START, message), flush=True)


_START = time.monotonic()


class MockKafka:
    """vipsd-mock-kafka as a child process, driven through its stdin."""

    def __init__(self, binary, brokers, topics, log_path=None):
        args = [binary, "--brokers", str(brokers)]
        for name, partitions in topics:
            args += ["--topic", "%s:%d" % (name, partitions)]
        # Its stderr (librdkafka's own assertions, if the mock dies) goes to
        # `log_path` when given, for describe() after a failure.
        self.log_path = log_path
        stderr = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, text=True, bufsize=1)
        first = self.proc.stdout.readline().split()
        check(len(first) == 2 and first[0] == "bootstrap",
              "vipsd-mock-kafka did not print its bootstrap list: %r" % first)
        self.bootstrap = first[1]
        self.brokers = brokers

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        check(reply.startswith("ok"), "mock kafka: %s -> %s" % (line, reply))
        return reply[2:].strip()

    def committed(self, group, topic):
        """{partition: committed offset (-1 none)}; None when the query fails
        (a broker is down or the coordinator is moving)."""
        self.proc.stdin.write("committed %s %s\n" % (group, topic))
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply.startswith("ok"):
            return None
        return {int(p): int(o) for p, o in (x.split("=") for x in reply[2:].split())}

    def watermarks(self, topic):
        out = {}
        for item in self.command("watermarks " + topic).split():
            p, lh = item.split("=")
            low, high = lh.split(":")
            out[int(p)] = (int(low), int(high))
        return out

    def leaders(self):
        """{(topic, partition): leader broker id} from the cluster's metadata,
        read by kcat (an independent client)."""
        result = run(["kcat", "-L", "-J", "-b", self.bootstrap], timeout=60)
        check(result.returncode == 0, "kcat -L failed: %s" % result.stderr[-500:])
        metadata = json.loads(result.stdout)
        return {(t["topic"], p["partition"]): p["leader"]
                for t in metadata["topics"] for p in t["partitions"]}

    def describe(self):
        """Whether the cluster process still runs, and the tail of its stderr."""
        code = self.proc.poll()
        state = "running" if code is None else (
            "killed by signal %d" % -code if code < 0 else "exited with status %d" % code)
        tail = ""
        if self.log_path and os.path.exists(self.log_path):
            with open(self.log_path, "rb") as f:
                tail = f.read()[-4000:].decode("utf-8", "replace")
        return "mock kafka: %s%s" % (state, ("\n" + tail) if tail else "")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class RealKafka:
    """A real Apache Kafka broker of the harness's own (scripts/kafka_broker.sh
    start DIRECTORY: KRaft, one node, loopback), with the topics created by
    the admin API (Debian's python3-confluent-kafka) as production topics
    are: message.timestamp.type=LogAppendTime, so the daemons run with the
    default source.timestamps: log_append_time. Same interface as MockKafka
    where the harnesses use it (bootstrap, describe, close)."""

    timestamps = "log_append_time"

    def __init__(self, directory, topics):
        script = os.path.join(SOURCE_DIR, "scripts", "kafka_broker.sh")
        self.script, self.directory = script, directory
        result = run([script, "start", directory], timeout=300)
        check(result.returncode == 0, "the Kafka broker did not start: %s" %
              result.stderr.decode(errors="replace")[-2000:])
        with open(os.path.join(directory, "bootstrap")) as f:
            self.bootstrap = f.read().strip()
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1,
                      config={"message.timestamp.type": "LogAppendTime"})
             for name, partitions in topics], operation_timeout=30)
        for name, future in futures.items():
            future.result(timeout=60)
        deadline = time.monotonic() + 30
        wanted = dict(topics)
        while time.monotonic() < deadline:
            metadata = admin.list_topics(timeout=10).topics
            if all(name in metadata and len(metadata[name].partitions) == n
                   for name, n in wanted.items()):
                break
            time.sleep(0.1)
        log("Apache Kafka at %s (%s)" % (self.bootstrap, directory))

    def describe(self):
        path = os.path.join(self.directory, "broker.log")
        tail = ""
        if os.path.exists(path):
            with open(path, "rb") as f:
                tail = f.read()[-4000:].decode("utf-8", "replace")
        return "kafka broker in %s%s" % (self.directory, ("\n" + tail) if tail else "")

    def restart(self):
        """Stops the broker (SIGTERM, a controlled shutdown) and starts it
        again on the same ports and data, as an operator's rolling restart
        of a one-node cluster would."""
        result = run([self.script, "restart", self.directory], timeout=300)
        check(result.returncode == 0, "the Kafka broker did not restart: %s" %
              result.stderr.decode(errors="replace")[-2000:])

    def close(self):
        run([self.script, "stop", self.directory], timeout=120)


class Vipsd:
    """One vipsd process; stderr and stdout appended to `log_path`."""

    def __init__(self, binary, config, log_path, args=()):
        self.log_path = log_path
        self.log_file = open(log_path, "ab")
        self.proc = subprocess.Popen([binary, "--config", config] + list(args),
                                     stdout=self.log_file, stderr=self.log_file)

    def alive(self):
        return self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if self.proc.poll() is not None:
                self.log_file.close()

    def log_tail(self, lines=40):
        with open(self.log_path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")


def stepped(log_path):
    """True once the daemon logged a step line in `log_path`."""
    with open(log_path, "rb") as f:
        data = f.read()
    return b'msg="step=' in data or b'"msg": "step=' in data


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, **kwargs)


def produce(bootstrap, topic, records):
    """records: list of (key, value str); one kcat call. Returns True on success."""
    data = "".join("%s\t%s\n" % (k, v) for k, v in records).encode()
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        path = f.name
    try:
        result = run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-l", path],
                     timeout=120)
        return result.returncode == 0
    finally:
        os.unlink(path)


KCAT_FORMAT = "vipsd-kcat %p %o %K %S\\n%k\\n%h\\n%s\\n"
# kcat -e stops at a partition's end only when a fetch comes back empty
# there. A real broker holds a fetch at the end for fetch.wait.max.ms
# (500 ms by default) and answers as soon as a record arrives, so on a topic
# written more often than that (a ledger topic, every step) -e never
# stops; the mock cluster answers at once. Every kcat read here asks for a
# short wait.


def dump_topic(bootstrap, topic):
    result = run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
                  "-X", "fetch.wait.max.ms=10",
                  "-f", KCAT_FORMAT], timeout=120)
    check(result.returncode == 0, "kcat could not read %s: %s" % (topic, result.stderr[-500:]))
    return result.stdout


def messages(bootstrap, topic):
    return _decode_release().read_kcat_dump(dump_topic(bootstrap, topic))


def releases(bootstrap, topic):
    """Complete, verified releases in topic order: list of (release id, step,
    sha256 of the manifest and every file)."""
    errors = []
    out = []
    for manifest, arrays, files in _decode_release().load_kcat_releases(
            dump_topic(bootstrap, topic), errors):
        digest = hashlib.sha256()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name] + b"\0")
        out.append((manifest["release_id"], manifest["step"], digest.hexdigest(), manifest))
    check(not errors, "release topic holds damaged releases: %s" % errors[:3])
    return out


def check_releases(found):
    """Release steps never go back; a release id always carries the same
    content. Returns {release id: content digest}."""
    seen = {}
    last_step = 0
    for release_id, step, digest, _ in found:
        if release_id in seen:
            check(seen[release_id] == digest,
                  "release %s was published twice with different content" % release_id)
        seen[release_id] = digest
        check(step >= last_step, "release steps went back: step %d after step %d" % (step, last_step))
        last_step = step
    return seen


def status(binary, state_dir):
    result = run([binary, "status", "--state", state_dir, "--delta", repr(DELTA), "--json"],
                 timeout=60)
    check(result.returncode in (0, 1), "vipsd status failed (%d): %s" %
          (result.returncode, result.stderr.decode(errors="replace")))
    report = json.loads(result.stdout)
    check(result.returncode == 0 and report.get("ledger_verifies") and
          report.get("checkpoint_verifies", True),
          "state directory does not verify (torn file?): %s" % report)
    return report


def scrape(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name] = float(value)
        except ValueError:
            pass
    return values


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_setup(directory, bootstrap, group, metrics_port=None, publish_timeout=10,
                interval=0.2, extra_kafka="", max_record_bytes=None, timestamps="create_time"):
    """A daemon's configuration; timestamps: create_time for the mock
    cluster (it keeps the producers' stamps), log_append_time for a real
    broker whose topics stamp on append."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCABULARY) + "\n")
    config = os.path.join(directory, "vipsd.yaml")
    with open(config, "w") as f:
        f.write("""model:
  type: lda
  lda:
    topics: 2
    vocabulary: vocab.txt
    alpha: 0.5
    eta: 0.1
    resample_length: 10
privacy:
  noise_multiplier: 1.0
  sampling_rate: 0.2
  delta: 1.0e-5
  epsilon_ceiling: 100000
schedule:
  tau0: 1
  kappa: 0.7
  threads: 1
  start_delay_seconds: 0
  on_overrun: catch_up
  window_steps: 1000000000
  interval_seconds: %s
pool:
  capacity: 10000
source:
  type: kafka
  topics: [docs]
  group_id: %s
  timestamps: %s
%ssink:
  type: kafka
  topic: releases
  publish_every: 1
  publish_timeout_seconds: %s
dead_letter:
  topic: dead
alerts:
  topic: alerts
kafka:
  bootstrap_servers: "%s"
  properties:
    reconnect.backoff.max.ms: "1000"
%s  consumer_properties:
    session.timeout.ms: "4000"
    heartbeat.interval.ms: "300"
state:
  directory: state
  checkpoint_every: 1
metrics:
  listen: "%s"
""" % (interval, group, timestamps,
       "  max_record_bytes: %d\n" % max_record_bytes if max_record_bytes else "",
       publish_timeout, bootstrap, extra_kafka,
       "127.0.0.1:%d" % metrics_port if metrics_port else ""))
    return config


def document(i):
    words = ["apple banana apple cherry", "date elder fig fig", "cherry fig apple date"]
    return '{"id": %d, "text": "%s"}' % (i, words[i % len(words)])


def record_batch(start, count, bad_every=7):
    """count records with keys r<start..>; every bad_every-th is malformed
    (key bad<i>) and must end up on the dead-letter topic."""
    out = []
    for i in range(start, start + count):
        if bad_every and i % bad_every == 3:
            out.append(("bad%d" % i, "not json %d" % i))
        else:
            out.append(("r%d" % i, document(i)))
    return out


def _dump_lines(bootstrap, topic, fmt):
    result = run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
                  "-X", "fetch.wait.max.ms=10",
                  "-f", fmt], timeout=120)
    check(result.returncode == 0, "kcat could not read %s: %s" % (topic, result.stderr[-500:]))
    return result.stdout.decode("utf-8", "replace").splitlines()


def dead_letter_copies(bootstrap):
    """{(partition, offset): copies} of every source record on the dead-letter
    topic (from the vipsd-source-* headers; descriptions may hold ',' so the
    release decoder's header parser is not used)."""
    out = {}
    for line in _dump_lines(bootstrap, "dead", "%h\\n"):
        partition = re.search(r"(?:^|,)vipsd-source-partition=(\d+)", line)
        offset = re.search(r"(?:^|,)vipsd-source-offset=(\d+)", line)
        if partition and offset:
            key = (int(partition.group(1)), int(offset.group(1)))
            out[key] = out.get(key, 0) + 1
    return out


def dead_letter_offsets(bootstrap):
    """{(partition, offset)} of every source record on the dead-letter topic."""
    return set(dead_letter_copies(bootstrap))


def bad_record_offsets(bootstrap):
    """{(partition, offset)} of every malformed record (key bad<i>) on the input topic."""
    out = set()
    for line in _dump_lines(bootstrap, "docs", "%p %o %k\\n"):
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith("bad"):
            out.add((int(parts[0]), int(parts[1])))
    return out


def seeded_random():
    seed = int(os.environ.get("VIPSD_HARNESS_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    log("random seed %d (VIPSD_HARNESS_SEED=%d reproduces the schedule)" % (seed, seed))
    return random.Random(seed)
