#!/usr/bin/env python3
"""Random-kill harness: the real vipsd against a Kafka cluster hosted in
another process (vipsd-mock-kafka), SIGKILLed at random moments and
restarted on the same state directory, while records keep arriving.

After every kill it checks, from outside the daemon:
  * the state directory verifies (`vipsd status`: ledger checksum and
    sections, checkpoint, checkpoint belongs to the ledger) — no torn file;
  * the step counter and ε never go back;
  * every complete release on the topic has a ledger entry at least as far
    (release step < the ledger's next step), release steps never go back,
    and a release id always carries the same bytes;
  * committed consumer offsets never run ahead of the daemon's work: every
    malformed record below a committed offset is already on the dead-letter
    topic (the daemon delivers dead letters before it stores offsets), and no
    committed offset is beyond the end of the log.
At the end a clean run drains the topic and stops on SIGTERM (exit 0): every
malformed record was dead-lettered, and at most twice over all the kills
(a restart re-reads each window from its start, but a record below the
group's committed offset is not dead-lettered again), the ledger's cuts
cover every record, the committed offsets reach the end of the log.

Usage: kill_harness.py --vipsd BIN --mock-kafka BIN [--kills N] [--workdir DIR]
Environment: VIPSD_HARNESS_SEED fixes the random schedule (printed at start);
VIPSD_HARNESS_KILLS is the default of --kills (30).
Exit status 0 when every check held, 1 otherwise (the failing check is
printed with the daemon's last log lines).
"""
import argparse
import os
import shutil
import signal
import sys
import time

import harness
from harness import check, log


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vipsd", required=True)
    parser.add_argument("--mock-kafka", required=True)
    parser.add_argument("--kills", type=int,
                        default=int(os.environ.get("VIPSD_HARNESS_KILLS", "30")))
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    rng = harness.seeded_random()
    work = args.workdir or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "vipsd-kill-harness-%d" % os.getpid())
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    kafka = harness.MockKafka(args.mock_kafka, 1,
                              [("docs", 2), ("releases", 1), ("dead", 1), ("alerts", 1)])
    daemon = None
    try:
        group = "vipsd-kill-%d" % os.getpid()
        config = harness.write_setup(work, kafka.bootstrap, group)
        state_dir = os.path.join(work, "state")
        next_record = 0
        check(harness.produce(kafka.bootstrap, "docs", harness.record_batch(0, 60)), "kcat produce")
        next_record = 60
        last_step, last_epsilon = 1, 0.0
        counts = {"kills": 0, "kills_before_ledger": 0, "max_next_step": 0, "releases": 0,
                  "dead_letter_checks": 0, "committed_checks": 0, "early": 0, "stepping": 0}
        for kill in range(1, args.kills + 1):
            log_path = os.path.join(work, "vipsd-%d.log" % kill)
            daemon = harness.Vipsd(args.vipsd, config, log_path)
            started = time.monotonic()
            # A quarter of the kills hit the start-up (ledger load, group
            # join, first commit); the rest hit a run that is stepping:
            # U(0, 2.5) s after its first step.
            early = rng.random() < 0.25
            deadline = started + (rng.uniform(0.05, 4.0) if early else 60)
            stepping_since = None
            while time.monotonic() < deadline and daemon.alive():
                if rng.random() < 0.5:
                    batch = harness.record_batch(next_record, rng.randint(1, 15))
                    check(harness.produce(kafka.bootstrap, "docs", batch), "kcat produce")
                    next_record += len(batch)
                if not early and stepping_since is None and harness.stepped(log_path):
                    stepping_since = time.monotonic()
                    deadline = stepping_since + rng.uniform(0.0, 2.5)
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            uptime = time.monotonic() - started
            check(early or stepping_since is not None,
                  "run %d took no step in 60 s:\n%s" % (kill, daemon.log_tail()))
            check(daemon.alive(), "vipsd exited by itself (status %s):\n%s" %
                  (daemon.proc.poll(), daemon.log_tail()))
            daemon.kill(signal.SIGKILL)
            check(daemon.wait(30) == -signal.SIGKILL, "vipsd did not die of SIGKILL")
            counts["kills"] += 1
            counts["early" if early else "stepping"] += 1
            if not os.path.exists(os.path.join(state_dir, "ledger")):
                counts["kills_before_ledger"] += 1
                log("kill %d after %.2fs: before the first ledger commit" % (kill, uptime))
                continue
            report = harness.status(args.vipsd, state_dir)
            step, epsilon = report["next_step"], report["epsilon_spent"]
            check(step >= last_step, "next_step went back: %d -> %d" % (last_step, step))
            check(epsilon >= last_epsilon, "epsilon went back: %r -> %r" % (last_epsilon, epsilon))
            last_step, last_epsilon = step, epsilon
            counts["max_next_step"] = step
            found = harness.releases(kafka.bootstrap, "releases")
            harness.check_releases(found)
            counts["releases"] = len(found)
            if found:
                check(max(r[1] for r in found) < step,
                      "release of step %d on the topic but the ledger's next step is %d" %
                      (max(r[1] for r in found), step))
            committed = kafka.committed(group, "docs")
            if committed is not None:
                counts["committed_checks"] += 1
                ends = kafka.watermarks("docs")
                dead = harness.dead_letter_offsets(kafka.bootstrap)
                for (partition, offset) in harness.bad_record_offsets(kafka.bootstrap):
                    if offset < committed.get(partition, -1):
                        counts["dead_letter_checks"] += 1
                        check((partition, offset) in dead,
                              "offset %d of partition %d was committed but its malformed record "
                              "is not on the dead-letter topic" % (offset, partition))
                for partition, offset in committed.items():
                    check(offset <= ends[partition][1],
                          "committed offset %d beyond the log end %d" % (offset, ends[partition][1]))
            log("kill %d (%s) after %.2fs: next_step=%d epsilon=%.4f releases=%d committed=%s" %
                (kill, "start-up" if early else "stepping", uptime, step, epsilon, len(found), committed))
        # A clean run drains everything and stops on SIGTERM.
        daemon = harness.Vipsd(args.vipsd, config, os.path.join(work, "vipsd-final.log"))
        check(harness.produce(kafka.bootstrap, "docs", harness.record_batch(next_record, 20)),
              "kcat produce")
        next_record += 20
        ends = kafka.watermarks("docs")
        bad = harness.bad_record_offsets(kafka.bootstrap)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            committed = kafka.committed(group, "docs") or {}
            dead = harness.dead_letter_offsets(kafka.bootstrap)
            if all(committed.get(p, -1) >= ends[p][1] for p in ends) and bad <= dead:
                break
            time.sleep(1)
        check(bad <= dead, "%d malformed records never reached the dead-letter topic" %
              len(bad - dead))
        check(all(committed.get(p, -1) >= ends[p][1] for p in ends),
              "committed offsets %s never reached the log ends %s" % (committed, ends))
        time.sleep(1.5)  # a few more slots, so that the cuts pass the log ends
        daemon.kill(signal.SIGTERM)
        code = daemon.wait(60)
        check(code == 0, "vipsd did not stop cleanly on SIGTERM (status %s):\n%s" %
              (code, daemon.log_tail()))
        report = harness.status(args.vipsd, state_dir)
        check(report["next_step"] >= last_step and report["epsilon_spent"] >= last_epsilon,
              "the final run went back: %s" % report)
        for stream, info in report["streams"].items():
            partition = int(stream.rsplit(":", 1)[1])
            check(info["cut"] >= ends[partition][1],
                  "the ledger's cut of %s (%d) does not cover the log end %d" %
                  (stream, info["cut"], ends[partition][1]))
        # Dead letters are bounded across restarts (issue 27): a record
        # dead-lettered before a kill is not dead-lettered again after it,
        # except in the moment between its delivery and its offset commit.
        copies = harness.dead_letter_copies(kafka.bootstrap)
        histogram = {}
        for n in copies.values():
            histogram[n] = histogram.get(n, 0) + 1
        check(max(copies.values(), default=0) <= 2,
              "a malformed record was dead-lettered %d times over %d kills (copies per record: "
              "%s)" % (max(copies.values()), counts["kills"], histogram))
        found = harness.releases(kafka.bootstrap, "releases")
        harness.check_releases(found)
        check(found and max(r[1] for r in found) < report["next_step"], "no release, or ahead")
        log("PASS: %d kills (%d at start-up, %d while stepping; %d before the first ledger "
            "commit), %d records produced "
            "(%d malformed, all dead-lettered; dead-letter copies per record %s), "
            "next_step=%d epsilon=%.4f, %d releases "
            "(steps increasing, one content per id), %d committed-offset checks, "
            "%d malformed records below committed offsets checked" %
            (counts["kills"], counts["early"], counts["stepping"], counts["kills_before_ledger"],
             next_record, len(bad), dict(sorted(histogram.items())),
             report["next_step"], report["epsilon_spent"], len(found),
             counts["committed_checks"], counts["dead_letter_checks"]))
        return 0
    except harness.HarnessFailure as failure:
        log("FAIL: %s" % failure)
        if daemon is not None:
            print("--- vipsd log tail ---\n" + daemon.log_tail(), flush=True)
        return 1
    finally:
        if daemon is not None and daemon.alive():
            daemon.kill(signal.SIGKILL)
            daemon.wait(10)
        kafka.close()
        if "VIPSD_HARNESS_KEEP" not in os.environ:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
