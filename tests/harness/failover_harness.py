#!/usr/bin/env python3
"""Failover harness (issue 16): three vipsd processes for one job — one
active, two hot standbys (state.standby_takeover_seconds), each with its own
state directory and consumer group, the job's budget of record on a ledger
topic — against a Kafka cluster hosted in another process
(vipsd-mock-kafka). At random it SIGKILLs the active process, pauses it
(SIGSTOP) long enough for a standby to take over and then resumes it, or
kills a standby; dead processes are restarted as standbys, as a supervisor
would.

Checked from outside after every event, with the ledger topic read by kcat
and folded here (an independent implementation of the validity rule of
docs/ledger_format.md "Ledger topic"):
  * exactly one owner steps: after each event the job's record moves on
    within a deadline;
  * the record's step counter and ε never go back (`vipsd status` on the
    record's ledger bytes);
  * every release on the topic is of a step the record charges (release
    step < the record's next step), a release id always carries the same
    bytes (so no step was released twice with different content);
  * a paused-and-resumed owner exits with status 1 ("fenced") and releases
    nothing charged to nobody; releases whose step is below an earlier
    release's (published late by a paused owner: the documented gap) are
    counted and allowed only after a pause.

With --shared (state.work_topic) the standbys work for the owner: all
processes are one consumer group over a 6-partition input, a process's
partitions move through ordinary rebalances when it dies, restarts or
joins, and a fourth process joins mid-run (a worker added). Also checked:
partial sums computed by other processes were merged into steps.

With --real-kafka the cluster is a real Apache Kafka broker of the
harness's own (scripts/kafka_broker.sh; topics stamped LogAppendTime, the
daemons on the default source.timestamps), instead of vipsd-mock-kafka.

--assignment cooperative-sticky makes the consumer group rebalance
incrementally (librdkafka's default, range/roundrobin, is eager);
--broker-restart restarts the real broker once, a third into the events
(the job must go on by itself once it is back).

--attempts N runs the whole harness again from scratch after a failure, up
to N runs in all (each failure's report is printed).

Usage: failover_harness.py --vipsd BIN (--mock-kafka BIN | --real-kafka) [--events N] [--shared]
                           [--assignment STRATEGY] [--broker-restart] [--attempts N]
Environment: VIPSD_HARNESS_SEED fixes the random schedule;
VIPSD_FAILOVER_EVENTS is the default of --events (8).
"""
import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import harness
from harness import check, log

TAKEOVER_SECONDS = 6  # above a start-up: the consumer-group join alone takes 3 s in the mock
PROCESSES = 3


def record_of(bootstrap, with_epoch=False):
    """The job's state of record: the last valid state entry (bytes) and the
    number of entries (and the epoch of that entry), folded with the rule of
    docs/ledger_format.md."""
    best = (0, "")
    record = None
    record_epoch = None
    entries = 0
    for message in harness.messages(bootstrap, "ledger"):
        if message.key != b"job":
            continue
        headers = dict(message.headers)
        epoch = (int(headers["vipsd-ledger-epoch"]), headers["vipsd-ledger-owner"])
        entries += 1
        if epoch >= best:
            best = epoch
            if headers["vipsd-ledger-kind"] == "state":
                record = message.value
                record_epoch = epoch
    if with_epoch:
        return record, entries, record_epoch
    return record, entries


def record_status(binary, record):
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "ledger"), "wb") as f:
            f.write(record)
        return harness.status(binary, directory)


class Member:
    """One of the job's processes, restarted as a standby when it dies."""

    def __init__(self, index, binary, config, work):
        self.index, self.binary, self.config, self.work = index, binary, config, work
        self.incarnation = 0
        self.proc = None
        self.paused = False

    def start(self):
        self.incarnation += 1
        self.log_path = os.path.join(self.work, "p%d-%d.log" % (self.index, self.incarnation))
        self.proc = harness.Vipsd(self.binary, self.config, self.log_path)

    def active(self):
        if self.proc is None or not self.proc.alive():
            return False
        with open(self.log_path, "rb") as f:
            return b"msg=\"started:" in f.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vipsd", required=True)
    cluster = parser.add_mutually_exclusive_group(required=True)
    cluster.add_argument("--mock-kafka")
    cluster.add_argument("--real-kafka", action="store_true",
                         help="a real Apache Kafka broker (scripts/kafka_broker.sh)")
    parser.add_argument("--events", type=int,
                        default=int(os.environ.get("VIPSD_FAILOVER_EVENTS", "8")))
    parser.add_argument("--shared", action="store_true",
                        help="state.work_topic: the standbys work for the owner")
    parser.add_argument("--assignment", default=None,
                        help="the consumers' partition.assignment.strategy")
    parser.add_argument("--broker-restart", action="store_true",
                        help="restart the real broker once mid-run (needs --real-kafka)")
    parser.add_argument("--attempts", type=int, default=1,
                        help="run again from scratch after a failure, up to this many runs")
    args = parser.parse_args()
    if args.broker_restart and not args.real_kafka:
        parser.error("--broker-restart needs --real-kafka")
    rng = harness.seeded_random()
    work = os.path.join(os.environ.get("TMPDIR", "/tmp"), "vipsd-failover-%d" % os.getpid())
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    topics = [("docs", 6 if args.shared else 2), ("releases", 1), ("dead", 1), ("alerts", 1),
              ("ledger", 1), ("work", 2)]
    if args.real_kafka:
        kafka = harness.RealKafka(os.path.join(work, "kafka"), topics)
    else:
        kafka = harness.MockKafka(args.mock_kafka, 1, topics,
                                  log_path=os.path.join(work, "mock-kafka.log"))
    members = []

    def new_member(i):
        directory = os.path.join(work, "p%d" % i)
        # Shared work: one consumer group for the job; otherwise each
        # process its own (a standby consumes nothing).
        group = "vipsd-failover-%d" % os.getpid() if args.shared else \
            "vipsd-failover-%d-%d" % (os.getpid(), i)
        config = harness.write_setup(directory, kafka.bootstrap, group,
                                     timestamps=getattr(kafka, "timestamps", "create_time"))
        with open(config) as f:
            text = f.read()
        text = text.replace(
            "state:\n  directory: state\n",
            "state:\n  directory: state\n  ledger_topic: ledger\n  ledger_key: job\n"
            "  standby_takeover_seconds: %s\n%s" %
            (TAKEOVER_SECONDS, "  work_topic: work\n" if args.shared else ""))
        if args.assignment:
            text = text.replace("  consumer_properties:\n",
                                "  consumer_properties:\n    partition.assignment.strategy: "
                                "\"%s\"\n" % args.assignment)
        with open(config, "w") as f:
            f.write(text)
        return Member(i, args.vipsd, config, work)

    try:
        for i in range(PROCESSES):
            members.append(new_member(i))
        next_record = 0
        check(harness.produce(kafka.bootstrap, "docs", harness.record_batch(0, 60)), "kcat produce")
        next_record = 60
        for member in members:
            member.start()

        last = {"next_step": 1, "epsilon_spent": 0.0}
        counts = {"kills": 0, "pauses": 0, "standby_kills": 0, "fenced_exits": 0,
                  "takeovers": 0, "late_releases": 0, "broker_restarts": 0}
        max_step_seen = 0

        def owner_epoch():
            return record_of(kafka.bootstrap, with_epoch=True)[2]

        def wait_for_progress(beyond, deadline_seconds=60, not_epoch=None):
            """Until the record's next step passes `beyond` (under an epoch
            other than `not_epoch`, if given); returns its status."""
            deadline = time.monotonic() + deadline_seconds
            while time.monotonic() < deadline:
                record, _, epoch = record_of(kafka.bootstrap, with_epoch=True)
                if record is not None and (not_epoch is None or epoch != not_epoch):
                    report = record_status(args.vipsd, record)
                    if report["next_step"] > beyond:
                        return report
                time.sleep(0.5)
            tails = "\n".join("--- p%d ---\n%s" % (m.index, m.proc.log_tail(15)) for m in members)
            check(False, "the job made no progress past step %d in %d s:\n%s" %
                  (beyond, deadline_seconds, tails))

        def check_invariants(paused_before):
            nonlocal max_step_seen
            # Releases first, then the record: every release read here was
            # confirmed before the record read after it.
            found = harness.releases(kafka.bootstrap, "releases")
            record, _ = record_of(kafka.bootstrap)
            check(record is not None, "no state entry on the ledger topic")
            report = record_status(args.vipsd, record)
            check(report["next_step"] >= last["next_step"],
                  "the record's next_step went back: %d -> %d" % (last["next_step"],
                                                                  report["next_step"]))
            check(report["epsilon_spent"] >= last["epsilon_spent"] - 1e-12,
                  "the record's epsilon went back: %r -> %r" % (last["epsilon_spent"],
                                                                report["epsilon_spent"]))
            last.update(next_step=report["next_step"], epsilon_spent=report["epsilon_spent"])
            seen = {}
            top = 0
            late = 0
            for release_id, step, digest, _ in found:
                check(seen.get(release_id, digest) == digest,
                      "release %s was published twice with different content" % release_id)
                seen[release_id] = digest
                if step < top:
                    late += 1
                top = max(top, step)
            if found:
                check(top < report["next_step"],
                      "release of step %d on the topic but the record's next step is %d" %
                      (top, report["next_step"]))
            check(late == 0 or paused_before,
                  "%d release(s) went back in step without any pause" % late)
            counts["late_releases"] = late
            max_step_seen = top
            return report, len(found)

        wait_for_progress(1)
        check_invariants(False)
        for event in range(1, args.events + 1):
            if args.shared and event == args.events // 2 + 1 and len(members) == PROCESSES:
                # A worker added mid-run: it joins the group and takes
                # partitions over through a rebalance.
                members.append(new_member(PROCESSES))
                members[-1].start()
                counts["added"] = 1
            if args.broker_restart and event == max(1, args.events // 3):
                # The broker goes away under every process and comes back on
                # the same ports and data: the job goes on by itself.
                before = last["next_step"]
                kafka.restart()
                counts["broker_restarts"] += 1
                report = wait_for_progress(before, deadline_seconds=120)
                report, releases = check_invariants(counts["pauses"] > 0)
                log("broker restarted: next_step=%d epsilon=%.4f releases=%d" %
                    (report["next_step"], report["epsilon_spent"], releases))
            if rng.random() < 0.5:
                batch = harness.record_batch(next_record, rng.randint(5, 20))
                check(harness.produce(kafka.bootstrap, "docs", batch), "kcat produce")
                next_record += len(batch)
            # A supervisor (systemd Restart=on-failure) restarts a process
            # that exited by itself: fenced, or a standby that lost a claim.
            for member in members:
                if not member.proc.alive():
                    code = member.proc.wait(1)
                    with open(member.log_path, "rb") as f:
                        text = f.read()
                    check(code == 1 and b"fenced" in text,
                          "p%d exited by itself with %r, not a fenced exit:\n%s" %
                          (member.index, code, member.proc.log_tail()))
                    counts["fenced_exits"] += 1
                    member.start()
            # One process believes it runs the job, and the owner of record
            # stayed the same for a second with it: two standbys that take
            # over at once both start, and the later claim fences the
            # earlier one only once it reads it (docs/ledger_format.md), so
            # the first to say "started" need not be the owner.
            deadline = time.monotonic() + 15
            while True:
                actives = [m for m in members if m.active()]
                epoch = owner_epoch()
                if len(actives) == 1:
                    time.sleep(1.0)
                    if [m for m in members if m.active()] == actives and owner_epoch() == epoch:
                        break
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
            check(len(actives) == 1, "event %d: %d processes believe they run the job:\n%s" %
                  (event, len(actives), "\n".join(m.proc.log_tail(10) for m in actives)))
            active = actives[0]
            before = last["next_step"]
            kind = rng.choice(["kill", "kill", "pause", "standby"])
            if kind == "kill":
                active.proc.kill(signal.SIGKILL)
                check(active.proc.wait(30) == -signal.SIGKILL, "no SIGKILL death")
                counts["kills"] += 1
                report = wait_for_progress(before, not_epoch=epoch)
                active.start()  # back as a standby
                counts["takeovers"] += 1
            elif kind == "pause":
                active.proc.kill(signal.SIGSTOP)
                counts["pauses"] += 1
                report = wait_for_progress(before, not_epoch=epoch)  # a standby took over
                active.proc.kill(signal.SIGCONT)
                code = active.proc.wait(60)
                check(code == 1, "a resumed, replaced owner exited with %r, not 1 (fenced):\n%s" %
                      (code, active.proc.log_tail()))
                with open(active.log_path, "rb") as f:
                    check(b"fenced" in f.read(), "the resumed owner did not log 'fenced'")
                counts["fenced_exits"] += 1
                counts["takeovers"] += 1
                active.start()
            else:
                standbys = [m for m in members if m is not active]
                victim = rng.choice(standbys)
                victim.proc.kill(signal.SIGKILL)
                victim.proc.wait(30)
                victim.start()
                counts["standby_kills"] += 1
                report = wait_for_progress(before)
            report, releases = check_invariants(counts["pauses"] > 0)
            log("event %d (%s): next_step=%d epsilon=%.4f releases=%d (top step %d)" %
                (event, kind, report["next_step"], report["epsilon_spent"], releases,
                 max_step_seen))
        # Let the last owner settle, then stop everyone cleanly.
        wait_for_progress(last["next_step"])
        check_invariants(counts["pauses"] > 0)
        for member in members:
            member.proc.kill(signal.SIGTERM)
        for member in members:
            code = member.proc.wait(60)
            with open(member.log_path, "rb") as f:
                fenced = b"fenced" in f.read()
            check(code == 0 or (code == 1 and fenced),
                  "p%d did not stop cleanly on SIGTERM (status %r):\n%s" %
                  (member.index, code, member.proc.log_tail()))
        _, entries = record_of(kafka.bootstrap)
        if args.shared:
            # The coordinators' step lines: partials=LOCAL+REMOTE.
            local = remote = continued = 0
            for name in os.listdir(work):
                if name.endswith(".log"):
                    with open(os.path.join(work, name), "rb") as f:
                        text = f.read()
                    for match in re.finditer(rb"partials=([0-9]+)\+([0-9]+)", text):
                        local += int(match.group(1))
                        remote += int(match.group(2))
                    continued += text.count(b"continuing from the model of step")
            check(remote > 0, "no step merged a partial sum computed by another process")
            # A worker that takes over continues from the model of the last
            # plan it followed, not from the prior.
            check(counts["takeovers"] == 0 or continued > 0,
                  "no takeover continued from the model of the last plan")
            log("shared work: %d partial sums merged from the coordinator itself, %d from "
                "workers; %d starts continued from the last plan's model (%d takeovers); a worker "
                "added mid-run: %s" % (local, remote, continued, counts["takeovers"],
                                       bool(counts.get("added"))))
        log("PASS: %d events (%d owner kills, %d pauses with a fenced exit, %d standby kills, "
            "%d broker restarts), %d takeovers, record next_step=%d epsilon=%.4f from %d "
            "ledger-topic entries, %d late release(s) after pauses, one content per release id"
            % (args.events, counts["kills"], counts["pauses"], counts["standby_kills"],
               counts["broker_restarts"], counts["takeovers"], last["next_step"],
               last["epsilon_spent"], entries, counts["late_releases"]))
        return 0
    except harness.HarnessFailure as failure:
        log("FAIL: %s" % failure)
        print("--- %s" % kafka.describe(), flush=True)
        for member in members:
            if member.proc is not None:
                print("--- p%d log tail ---\n%s" % (member.index, member.proc.log_tail()),
                      flush=True)
        return 1
    finally:
        for member in members:
            if member.proc is not None and member.proc.alive():
                member.proc.kill(signal.SIGCONT)
                member.proc.kill(signal.SIGKILL)
                member.proc.wait(10)
        kafka.close()
        if "VIPSD_HARNESS_KEEP" not in os.environ:
            shutil.rmtree(work, ignore_errors=True)


def main_with_attempts():
    attempts = 1
    if "--attempts" in sys.argv:
        attempts = max(1, int(sys.argv[sys.argv.index("--attempts") + 1]))
    for attempt in range(1, attempts + 1):
        code = main()
        if code == 0 or attempt == attempts:
            return code
        log("attempt %d of %d failed (its report is above); running again from scratch" %
            (attempt, attempts))
    return 1


if __name__ == "__main__":
    sys.exit(main_with_attempts())
