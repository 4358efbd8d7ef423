#!/usr/bin/env python3
"""Before and after, back to back: bench/shared_work_bench.py for two vipsd
builds on the same machine, one configuration at a time, the builds
alternating (issue 30: "report every cell of the table again, before and
after, back to back on the same machine").

Each round runs every configuration once with each build; odd rounds run
the "before" build first, even rounds the "after" build first, so a drift
of the machine's speed during the session falls on both. Every run is its
own shared_work_bench.py call (a fresh mock cluster). A configuration that
a build cannot run (it exits with an error; one that makes no step ends
at the bench's 600 s limit for the coordinator) is reported as such, with
the last line of the error, and the session goes on.

Prints one JSON line per run (the bench's row, plus "build", "round" and
"configuration"),
then a Markdown table:

  configuration, steps/s of each round (before | after), x solo 1 thread
  (each build's own solo:1 mean; the mean over rounds, before -> after),
  the after build's mean steps/s over the before build's, CPU s per
  process and the coordinator's serial ms per step (% of the step), after
  (its first run).

Usage: shared_work_compare.py --before BIN --after BIN --mock-kafka BIN
       [--rounds N] [--configs LIST] [BENCH ARGS...]
BENCH ARGS go to shared_work_bench.py (--docs, --steps, --topics, --q,
--vocab-size, --partitions, --corpus, --vocab, ...). --configs defaults to
issue 30's table: solo:1,solo:2,solo:4,solo:8,1:1,2:1,4:1,8:1,4:2; solo:1
is always run (the ratios need it). Wrap it in `flock out/vipsd-cpu.lock`
on a shared machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shared_work_bench.py")
ISSUE_TABLE = "solo:1,solo:2,solo:4,solo:8,1:1,2:1,4:1,8:1,4:2"


def run_one(binary, mock_kafka, config, bench_args):
    """The bench's JSON row for one configuration, or {"error": ...}."""
    command = [sys.executable, BENCH, "--vipsd", binary, "--mock-kafka", mock_kafka,
               "--configs", config] + bench_args
    result = subprocess.run(command, capture_output=True, text=True)
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not rows:
        lines = [l for l in (result.stderr or result.stdout).strip().splitlines() if l.strip()]
        return {"error": lines[-1][:200] if lines else "exit status %d" % result.returncode}
    return rows[-1]


def label(config):
    name, _, threads = config.partition(":")
    threads, _, coordinator = threads.partition("+")
    if name == "solo":
        return "solo, %s thread%s" % (threads, "" if threads == "1" else "s")
    text = "shared, %s × %s thread%s" % (name.rstrip("c"), threads, "" if threads == "1" else "s")
    if name.endswith("c"):
        text += ", the coordinator reads none"
    if coordinator:
        text += ", the coordinator %s threads" % coordinator
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--mock-kafka", required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--configs", default=ISSUE_TABLE)
    args, bench_args = parser.parse_known_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    configs = args.configs.split(",")
    if "solo:1" not in configs:
        configs.insert(0, "solo:1")
    builds = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    mock_kafka = os.path.abspath(args.mock_kafka)
    results = {}  # (config, build) -> [row per round]
    for round_index in range(1, args.rounds + 1):
        order = ["before", "after"] if round_index % 2 == 1 else ["after", "before"]
        for config in configs:
            for build in order:
                row = run_one(builds[build], mock_kafka, config, bench_args)
                row.update(build=build, round=round_index, configuration=config)
                print(json.dumps(row), flush=True)
                results.setdefault((config, build), []).append(row)

    def speeds(config, build):
        return [r["steps_per_second"] for r in results[(config, build)] if "error" not in r]

    solo = {b: statistics.mean(speeds("solo:1", b)) if speeds("solo:1", b) else None
            for b in builds}
    print("\n| configuration | steps/s before | steps/s after | × solo, 1 thread, "
          "before → after | after ÷ before | CPU s per process after (coordinator last) | "
          "coordinator serial ms/step after (% of step) |")
    print("|---|---|---|---|---|---|---|")
    for config in configs:
        cells = []
        for build in builds:
            rows = results[(config, build)]
            cells.append(" / ".join("%.2f" % r["steps_per_second"] if "error" not in r
                                    else "does not run" for r in rows))
        ratios = []
        for build in builds:
            values = speeds(config, build)
            ratios.append("%.2f" % (statistics.mean(values) / solo[build])
                          if values and solo[build] else "–")
        gain = ("%.2f" % (statistics.mean(speeds(config, "after")) /
                          statistics.mean(speeds(config, "before")))
                if speeds(config, "after") and speeds(config, "before") else "–")
        after = next((r for r in results[(config, "after")] if "error" not in r), None)
        if after is None:
            cpu = serial = "–"
        else:
            cpu = " / ".join("%.1f" % c for c in after["cpu_seconds"])
            serial = ("%.1f (%.0f %%)" % (after["coordinator_serial_ms"],
                                          100 * after["coordinator_serial_ms"] / after["step_ms"])
                      if after["coordinator_phase_ms"] else "–")
        print("| %s | %s | %s | %s → %s | %s | %s | %s |" % (
            label(config), cells[0], cells[1], ratios[0], ratios[1], gain, cpu, serial))
    errors = {(r["configuration"], r["build"]): r["error"] for rows in results.values()
              for r in rows if "error" in r}
    for (config, build), error in sorted(errors.items()):
        print("\n%s, %s build: %s" % (config, build, error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
