#!/usr/bin/env python3
"""Every test that docs/threat_model.md's index ("What pins the claim, and
the test for each") names exists: a gtest `Suite.Name` (or `…Name`, the
suite of the name before it) is defined under tests/, and a ctest name
(`daemon.status_command`, `real_kafka.transactions`, …) is registered by
tests/CMakeLists.txt or one of the scripts it runs. A renamed or deleted
test fails here instead of leaving the index pointing at nothing.

Usage: cited_tests_test.py SOURCE_DIR
"""
import os
import re
import sys


def main():
    root = sys.argv[1]
    with open(os.path.join(root, "docs", "threat_model.md"), encoding="utf-8") as f:
        text = f.read()
    index = text[text.index("## What pins the claim, and the test for each"):]
    sources = []
    for directory, _, files in os.walk(os.path.join(root, "tests")):
        for name in files:
            if name.endswith((".cc", ".h", ".py", ".sh", ".txt")):
                with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
                    sources.append(f.read())
    corpus = "\n".join(sources)
    missing, checked = [], 0
    for row in index.splitlines():
        if not row.startswith("|") or row.startswith("|---"):
            continue
        cells = row.split("|")
        if len(cells) < 4 or cells[3].strip() == "Test":
            continue
        suite = None
        for token in re.findall(r"`([^`]+)`", cells[3]):
            if re.fullmatch(r"[A-Z]\w*\.[A-Z]\w*", token):
                suite, name = token.split(".")
                found = re.search(r"\(\s*%s\s*,\s*%s\s*\)" % (suite, name), corpus)
            elif token.startswith("…"):
                name = token[1:].lstrip(".")
                found = suite and re.search(r"\(\s*%s\s*,\s*%s\s*\)" % (suite, name), corpus)
            elif re.fullmatch(r"[a-z_]+\.[a-z_]+", token):
                group, case = token.split(".")
                found = token in corpus or (f'"{case}"' in corpus and group in corpus)
            else:
                continue
            checked += 1
            if not found:
                missing.append(token)
    if checked < 20:
        print(f"the index names only {checked} tests: was it parsed?")
        return 1
    if missing:
        print("docs/threat_model.md names tests that do not exist: " + ", ".join(missing))
        return 1
    print(f"ok: {checked} tests named by docs/threat_model.md exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
