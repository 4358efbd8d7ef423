#!/usr/bin/python3
"""The planner commands the README and docs/privacy_planning.md show run,
and what the README says about them is what they print (issue 29).

  readme_commands_test.py BUILD_DIR SOURCE_DIR

* Every `build/tools/vipsd-privacy ...` line in a ```sh block of README.md
  and docs/privacy_planning.md runs from the source directory (with
  BUILD_DIR for build/) and exits 0 with output.
* The step count the README gives for the demo ("about N steps") is the
  planner's steps_to_ceiling for config/examples/demo.yaml.
* Every field the README's `plan --json` paragraph names is a key of
  `plan --json` for a global-accounting configuration (the demo), a
  residency one or one with a privacy unit (key or field), and every key
  plan prints is named there.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile


def sh_lines(path):
    """The command lines of the ```sh blocks of a Markdown file."""
    lines, inside = [], False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                inside = line.strip() == "```sh" if not inside else False
                continue
            if inside and line.strip():
                lines.append((number, line.rstrip("\n")))
    return lines


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: readme_commands_test.py BUILD_DIR SOURCE_DIR")
    build, source = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
    planner = os.path.join(build, "tools", "vipsd-privacy")
    failures, ran = [], 0
    for doc in ("README.md", "docs/privacy_planning.md"):
        for number, line in sh_lines(os.path.join(source, doc)):
            command = line.split("#", 1)[0].strip()
            if not command.startswith("build/tools/vipsd-privacy"):
                continue
            args = shlex.split(command)
            args[0] = planner
            result = run(args, source)
            ran += 1
            if result.returncode != 0 or not result.stdout.strip():
                failures.append(f"{doc}:{number}: `{command}` exited {result.returncode}: "
                                f"{result.stderr.strip()[-300:]}")
    if ran < 4:
        failures.append(f"only {ran} planner commands found in the docs' sh blocks")

    readme = open(os.path.join(source, "README.md"), encoding="utf-8").read()
    demo = run([planner, "plan", "--config", "config/examples/demo.yaml", "--json"], source)
    plan = json.loads(demo.stdout)
    claimed = re.search(r"about (\d+) steps for the demo", readme)
    if not claimed:
        failures.append("README.md: no 'about N steps for the demo' next to the plan command")
    elif int(claimed.group(1)) != plan["steps_to_ceiling"]:
        failures.append(f"README.md says about {claimed.group(1)} steps for the demo; the planner "
                        f"says {plan['steps_to_ceiling']}")

    paragraph = re.search(r"With `--json`, `plan` prints one object:(.*?)\n\n", readme, re.S)
    if not paragraph:
        failures.append("README.md: the `plan --json` paragraph is missing")
        named = set()
    else:
        named = set(re.findall(r"`([a-z_]+)`", paragraph.group(1)))
    # The demo with residency accounting over a 20-step window, in a copy of
    # config/examples (its relative paths stay valid).
    work = tempfile.mkdtemp()
    try:
        examples = os.path.join(work, "examples")
        shutil.copytree(os.path.join(source, "config/examples"), examples)
        with open(os.path.join(examples, "demo.yaml"), encoding="utf-8") as f:
            text = f.read()
        text = text.replace("accounting: global", "accounting: residency", 1)
        text = re.sub(r"window_steps: \S+", "window_steps: 20", text, count=1)
        with open(os.path.join(examples, "residency.yaml"), "w", encoding="utf-8") as f:
            f.write(text)
        residency = run([planner, "plan", "--config", "residency.yaml", "--json"], examples)
        # A privacy unit: the message key (the demo) and a named field (the
        # offline example).
        keyed_text = text.replace("accounting: residency", "accounting: global\n  unit: key\n"
                                  "  max_records_per_unit: 5", 1)
        with open(os.path.join(examples, "keyed.yaml"), "w", encoding="utf-8") as f:
            f.write(keyed_text)
        with open(os.path.join(examples, "lda_offline.yaml"), encoding="utf-8") as f:
            field_text = re.sub(r"\n  noise: secure[^\n]*", "\n  noise: secure\n  unit: field\n"
                                "  unit_field: person\n  max_records_per_unit: 5", f.read(), count=1)
        with open(os.path.join(examples, "field.yaml"), "w", encoding="utf-8") as f:
            f.write(field_text)
        unit_plans = []
        for name, unit in (("keyed.yaml", "key"), ("field.yaml", "field")):
            result = run([planner, "plan", "--config", name, "--json"], examples)
            try:
                unit_plans.append(json.loads(result.stdout))
            except ValueError:
                failures.append(f"plan --json on a {unit} unit printed no JSON: "
                                f"{result.stderr.strip()[-300:]}")
                continue
            if unit_plans[-1].get("unit") != unit:
                failures.append(f"the {unit} unit planned as {unit_plans[-1].get('unit')}")
    finally:
        shutil.rmtree(work)
    try:
        residency_plan = json.loads(residency.stdout)
    except ValueError:
        failures.append(f"plan --json on a residency configuration printed no JSON: "
                        f"{residency.stderr.strip()[-300:]}")
        residency_plan = {}
    if residency_plan and residency_plan.get("accounting") != "residency":
        failures.append(f"the residency configuration planned as {residency_plan.get('accounting')}")
    printed = (set(plan) | set(residency_plan)) - {"command"}
    for unit_plan in unit_plans:
        printed |= set(unit_plan) - {"command"}
    for key in sorted(printed - named):
        failures.append(f"plan --json prints `{key}`, which the README's paragraph does not name")
    for key in sorted(named - printed):
        failures.append(f"the README's plan --json paragraph names `{key}`, which plan does not print")
    for field in ("steps_to_ceiling", "steps", "max_steps"):
        if plan.get(field) != plan["steps_to_ceiling"]:
            failures.append(f"plan --json: {field} = {plan.get(field)}, steps_to_ceiling = "
                            f"{plan['steps_to_ceiling']}")

    for failure in failures:
        print("FAIL: " + failure, file=sys.stderr)
    if failures:
        return 1
    print(f"{ran} planner commands from the docs ran; the demo plans {plan['steps_to_ceiling']} "
          f"steps as the README says; the README names all {len(printed)} plan --json fields")
    return 0


if __name__ == "__main__":
    sys.exit(main())
