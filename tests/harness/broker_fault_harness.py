#!/usr/bin/env python3
"""Broker-fault harness: the real vipsd against a 3-broker Kafka cluster
hosted in another process (vipsd-mock-kafka) while records flow, through a
sequence of faults: one broker down and up (broker 1, made the leader of
input partition docs:0 first: the mock picks leaders at random, and a broker
that leads nothing vipsd reads or writes can go down unnoticed); every broker down for longer
than the publish timeout; retriable request errors injected on produce,
fetch and list-offsets (the slot clock); offset commits refused with
OFFSET_METADATA_TOO_LARGE (not retried by librdkafka, so the failure must
reach vipsd_kafka_errors_total{kind="commit"}); 400 ms of latency on every
broker; a poison record (a malformed record of 1,000,000 bytes, whose whole
copy would not fit a dead letter).

Checks, from outside the daemon:
  * the daemon keeps running through every fault (same process, no restart)
    and stops cleanly on SIGTERM at the end;
  * the fault shows in its metrics (vipsd_kafka_errors_total rises during
    the outages; vipsd_release_pending is 1 and vipsd_releases_failed_total
    rises while every broker is down);
  * it recovers by itself: after each fault ends, a new release (a higher
    vipsd_last_release_step, vipsd_release_pending 0) appears; the recovery
    time of each fault is printed;
  * no release is lost or duplicated with other content: release steps on
    the topic never go back, a release id always carries the same bytes,
    every release the daemon counted as published is on the topic, the last
    release on the topic is the daemon's last, and the ledger is ahead of
    every release; every malformed record reached the dead-letter topic.

Usage: broker_fault_harness.py --vipsd BIN --mock-kafka BIN [--workdir DIR]
Exit status 0 when every check held, 1 otherwise.
"""
import argparse
import os
import shutil
import signal
import sys
import time

import harness
from harness import check, log

PUBLISH_TIMEOUT = 4  # seconds; the all-brokers outage lasts longer
EXPECT_GRACE = 15  # seconds a fault may be held past its length until it shows what it must


def metric(values, name):
    return values.get(name, 0.0) if values else 0.0


def kafka_errors(values):
    return sum(v for k, v in (values or {}).items() if k.startswith("vipsd_kafka_errors_total"))


class Run:
    def __init__(self, args):
        self.args = args
        self.work = args.workdir or os.path.join(
            os.environ.get("TMPDIR", "/tmp"), "vipsd-fault-harness-%d" % os.getpid())
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.kafka = harness.MockKafka(args.mock_kafka, 3,
                                       [("docs", 3), ("releases", 1), ("dead", 1), ("alerts", 1)])
        # Broker 1, which the first fault takes down, leads input partition
        # docs:0 (the daemon fetches from it); the release topic is on
        # broker 2, so releases go on while broker 1 is down.
        self.kafka.command("leader docs 0 1")
        self.kafka.command("leader releases 0 2")
        leaders = self.kafka.leaders()
        check(leaders.get(("docs", 0)) == 1 and leaders.get(("releases", 0)) == 2,
              "the mock did not take the leaders the harness set: %s" % leaders)
        self.port = harness.free_port()
        self.group = "vipsd-fault-%d" % os.getpid()
        self.config = harness.write_setup(
            self.work, self.kafka.bootstrap, self.group, metrics_port=self.port,
            publish_timeout=PUBLISH_TIMEOUT, max_record_bytes=1 << 20,
            extra_kafka='  producer_properties:\n    retry.backoff.ms: "200"\n')
        self.next_record = 0
        self.daemon = None
        self.recoveries = []

    def produce(self, count, fault_tolerant=True):
        batch = harness.record_batch(self.next_record, count)
        ok = harness.produce(self.kafka.bootstrap, "docs", batch) if not fault_tolerant else \
            harness.run(["kcat", "-P", "-b", self.kafka.bootstrap, "-t", "docs", "-K", "\t",
                         "-X", "message.timeout.ms=3000"],
                        input="".join("%s\t%s\n" % kv for kv in batch).encode(),
                        timeout=60).returncode == 0
        if ok:
            self.next_record += count
        return ok

    def metrics(self):
        return harness.scrape(self.port)

    def wait_release_after(self, step, seconds, what):
        """Seconds until a release of a step > `step` is published."""
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            check(self.daemon.alive(), "vipsd exited during %s:\n%s" % (what, self.daemon.log_tail()))
            values = self.metrics()
            if metric(values, "vipsd_last_release_step") > step and \
                    metric(values, "vipsd_release_pending") == 0:
                return time.monotonic() - start
            self.produce(2)
            time.sleep(0.2)
        raise harness.HarnessFailure("no release after %s within %d s:\n%s" %
                                     (what, seconds, self.daemon.log_tail()))

    def fault(self, name, start_commands, hold_seconds, end_commands, expect=None):
        before = self.metrics()
        check(before is not None, "metrics endpoint unreachable before %s" % name)
        log("fault: %s (%.0f s)" % (name, hold_seconds))
        for command in start_commands:
            self.kafka.command(command)
        seen_during = {"errors": 0.0, "pending": 0.0, "failed": 0.0, "commit": 0.0}
        commit_key = 'vipsd_kafka_errors_total{kind="commit"}'
        # The fault is held for hold_seconds, and longer (up to EXPECT_GRACE
        # more) until what it must show has shown: an offset commit, for
        # one, is only tried at the auto-commit interval, which a loaded
        # machine can push past a short hold.
        end = time.monotonic() + hold_seconds
        latest = end + EXPECT_GRACE
        while time.monotonic() < latest:
            check(self.daemon.alive(), "vipsd exited during %s:\n%s" % (name, self.daemon.log_tail()))
            self.produce(3)
            values = self.metrics()
            if values:
                seen_during["errors"] = max(seen_during["errors"],
                                            kafka_errors(values) - kafka_errors(before))
                seen_during["commit"] = metric(values, commit_key) - metric(before, commit_key)
                seen_during["pending"] = max(seen_during["pending"],
                                             metric(values, "vipsd_release_pending"))
                seen_during["failed"] = max(
                    seen_during["failed"], metric(values, "vipsd_releases_failed_total") -
                    metric(before, "vipsd_releases_failed_total"))
            if time.monotonic() >= end and all(
                    seen_during[key] >= minimum for key, minimum in (expect or {}).items()):
                break
            time.sleep(0.5)
        for command in end_commands:
            self.kafka.command(command)
        at_end = self.metrics() or {}
        last = metric(at_end, "vipsd_last_release_step")
        recovery = self.wait_release_after(last, 60, name)
        after = self.metrics() or {}
        seen_during["errors"] = max(seen_during["errors"], kafka_errors(after) - kafka_errors(before))
        seen_during["commit"] = metric(after, commit_key) - metric(before, commit_key)
        for key, minimum in (expect or {}).items():
            check(seen_during[key] >= minimum,
                  "%s: expected %s >= %s in the metrics, saw %s" %
                  (name, key, minimum, seen_during[key]))
        log("  recovered %.2f s after the fault ended; metrics during it: kafka errors +%d "
            "(commit +%d), release pending %d, releases failed +%d" %
            (recovery, seen_during["errors"], seen_during["commit"], seen_during["pending"],
             seen_during["failed"]))
        self.recoveries.append((name, recovery, seen_during))

    def poison_record(self):
        """A malformed record of 1,000,000 bytes, under source.max_record_bytes
        (1 MiB here, the old default): its
        dead letter used to exceed the producer's message.max.bytes and stop
        consumption for good (issue 27). It must be dead-lettered (cut to fit,
        with vipsd-payload-truncated) while records after it are consumed."""
        log("poison: a malformed record of 1,000,000 bytes")
        value = '{"id": 1, "text": "' + "x" * (1000000 - 19)
        produced = harness.run(
            ["kcat", "-P", "-b", self.kafka.bootstrap, "-t", "docs", "-K", "\t",
             "-X", "message.max.bytes=2000000"],
            input=("bad-poison\t%s\n" % value).encode(), timeout=60)
        check(produced.returncode == 0, "kcat could not produce the poison record: %s" %
              produced.stderr[-500:])
        start = time.monotonic()
        check(self.produce(6, fault_tolerant=False), "kcat produce")
        ends = self.kafka.watermarks("docs")
        # Observed 33-60 s on a 2-core machine (why it takes that long is not
        # understood yet); the test is that consumption goes on, not how fast.
        deadline = start + 150
        while time.monotonic() < deadline:
            check(self.daemon.alive(), "vipsd exited after the poison record:\n%s" %
                  self.daemon.log_tail())
            committed = self.kafka.committed(self.group, "docs") or {}
            if all(committed.get(p, -1) >= ends[p][1] for p in ends):
                break
            time.sleep(0.5)
        check(all(committed.get(p, -1) >= ends[p][1] for p in ends),
              "consumption stopped at the poison record: committed %s, log ends %s\n%s" %
              (committed, ends, self.daemon.log_tail()))
        cut = [line for line in harness._dump_lines(self.kafka.bootstrap, "dead", "%h\\n")
               if "vipsd-payload-truncated=1000000" in line]
        check(len(cut) == 1, "the poison record's dead letter (cut, with "
              "vipsd-payload-truncated=1000000) is on the dead-letter topic %d times" % len(cut))
        elapsed = time.monotonic() - start
        log("  consumed past it in %.2f s; its dead letter was cut to fit and delivered once"
            % elapsed)
        self.recoveries.append(("poison record", elapsed, {}))

    def main(self):
        check(self.produce(60, fault_tolerant=False), "kcat produce")
        self.daemon = harness.Vipsd(self.args.vipsd, self.config, os.path.join(self.work, "vipsd.log"))
        pid = self.daemon.proc.pid
        self.wait_release_after(0, 60, "start-up")
        self.fault("broker 1 down", ["down 1"], 6, ["up 1"], {"errors": 1})
        self.fault("all brokers down (longer than the publish timeout)",
                   ["down 1", "down 2", "down 3"], PUBLISH_TIMEOUT + 8,
                   ["up 1", "up 2", "up 3"], {"errors": 1})
        self.fault("produce request errors",
                   ["errors produce 12 NOT_LEADER_FOR_PARTITION REQUEST_TIMED_OUT"], 4,
                   ["clear produce"])
        self.fault("fetch request errors", ["errors fetch 12 NOT_LEADER_FOR_PARTITION"], 4,
                   ["clear fetch"])
        self.fault("list-offsets request errors (the slot clock)",
                   ["errors list_offsets 6 NOT_LEADER_FOR_PARTITION"], 4, ["clear list_offsets"])
        self.fault("offset commits refused",
                   ["errors offset_commit 4 OFFSET_METADATA_TOO_LARGE"], 7,
                   ["clear offset_commit"], {"commit": 1})
        self.fault("400 ms latency on every broker", ["rtt 1 400", "rtt 2 400", "rtt 3 400"], 6,
                   ["rtt 1 0", "rtt 2 0", "rtt 3 0"])
        self.poison_record()
        check(self.daemon.proc.pid == pid and self.daemon.alive(), "vipsd restarted or exited")
        # Drain: every malformed record dead-lettered, then stop.
        bad = harness.bad_record_offsets(self.kafka.bootstrap)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not bad <= harness.dead_letter_offsets(self.kafka.bootstrap):
            time.sleep(1)
        dead = harness.dead_letter_offsets(self.kafka.bootstrap)
        check(bad <= dead, "%d malformed records never reached the dead-letter topic" %
              len(bad - dead))
        final = self.metrics() or {}
        self.daemon.kill(signal.SIGTERM)
        code = self.daemon.wait(60)
        check(code == 0, "vipsd did not stop cleanly (status %s):\n%s" % (code, self.daemon.log_tail()))
        report = harness.status(self.args.vipsd, os.path.join(self.work, "state"))
        found = harness.releases(self.kafka.bootstrap, "releases")
        ids = harness.check_releases(found)
        published = metric(final, "vipsd_releases_published_total")
        check(len(ids) >= published,
              "the daemon counted %d releases published but the topic holds %d release ids" %
              (published, len(ids)))
        last_on_topic = found[-1][1] if found else 0
        check(last_on_topic >= metric(final, "vipsd_last_release_step"),
              "the daemon's last release (step %d) is not on the topic (last there: %d)" %
              (metric(final, "vipsd_last_release_step"), last_on_topic))
        check(last_on_topic < report["next_step"], "a release is ahead of the ledger")
        log("PASS: %d faults injected, the daemon (pid %d) ran through all of them; %d records "
            "produced (%d malformed, all dead-lettered); %d release ids on the topic (%d copies), "
            "%d counted published, steps increasing, one content per id; ledger next_step=%d "
            "epsilon=%.4f" % (len(self.recoveries), pid, self.next_record, len(bad), len(ids),
                              len(found), published, report["next_step"], report["epsilon_spent"]))
        print("recovery times (s): " + "; ".join("%s %.2f" % (n, r) for n, r, _ in self.recoveries))
        return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vipsd", required=True)
    parser.add_argument("--mock-kafka", required=True)
    parser.add_argument("--workdir", default=None)
    run = Run(parser.parse_args())
    try:
        return run.main()
    except harness.HarnessFailure as failure:
        log("FAIL: %s" % failure)
        if run.daemon is not None:
            print("--- vipsd log tail ---\n" + run.daemon.log_tail(60), flush=True)
        return 1
    finally:
        if run.daemon is not None and run.daemon.alive():
            run.daemon.kill(signal.SIGKILL)
            run.daemon.wait(10)
        run.kafka.close()
        if "VIPSD_HARNESS_KEEP" not in os.environ:
            shutil.rmtree(run.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
