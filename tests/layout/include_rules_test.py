#!/usr/bin/env python3
"""The project's folders include only the folders below them.

Usage: include_rules_test.py REPO_ROOT

Every `#include "X/..."` of a project header in a .h or .cc file under a
folder named below must name a folder that folder may use. The rules are the
layering docs/development.md describes: core is pure computation and never
includes config, connectors, daemon or tools; inside core, base is at the
bottom, and the two halves of core/privacy (mechanisms: what touches the
statistics and the noise; accounting: what computes epsilon) never include
each other; the daemon's folders (state, io, parts, setup, step, service)
include only the ones below them. Exits 1 naming every include that breaks a rule, and fails too
when a folder it expects is gone (a rename must update the rules) or a rule
names nothing (so that a mistyped prefix cannot pass vacuously).
"""
import pathlib
import re
import sys

PRIVACY = ("core/privacy/mechanisms/", "core/privacy/accounting/")
OUTSIDE_DAEMON = ("core/", "config/", "connectors/")
# folder -> folders (prefixes) its files may include, besides itself
RULES = {
    "core/base/": (),
    "core/privacy/mechanisms/": ("core/base/",),
    "core/privacy/accounting/": ("core/base/",),
    "core/text/": ("core/base/",),
    "core/model/": ("core/base/",) + PRIVACY,
    "core/release/": ("core/base/",) + PRIVACY,
    "core/models/": ("core/base/", "core/model/", "core/release/") + PRIVACY,
    "core/svi/": ("core/base/", "core/model/") + PRIVACY,
    # Outside core: nothing includes the daemon or the tools but themselves.
    "connectors/": ("core/",),
    "config/": ("core/", "connectors/file/"),
    # The daemon's folders, bottom to top (daemon/README.md); main.cc, in
    # daemon/ itself, may use them all.
    "daemon/state/": OUTSIDE_DAEMON,
    "daemon/io/": OUTSIDE_DAEMON + ("daemon/state/",),
    "daemon/parts/": OUTSIDE_DAEMON + ("daemon/state/", "daemon/io/"),
    "daemon/setup/": OUTSIDE_DAEMON + ("daemon/state/", "daemon/io/", "daemon/parts/"),
    "daemon/step/": OUTSIDE_DAEMON + ("daemon/state/", "daemon/io/", "daemon/parts/",
                                      "daemon/setup/"),
    "daemon/service/": OUTSIDE_DAEMON + ("daemon/state/", "daemon/io/", "daemon/parts/",
                                         "daemon/setup/", "daemon/step/"),
    "daemon/": OUTSIDE_DAEMON,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+/[^"]+)"', re.M)


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    errors = []
    for folder, allowed in RULES.items():
        files = [p for p in (root / folder).rglob("*") if p.suffix in (".h", ".cc")]
        if not files:
            errors.append(f"{folder}: no .h or .cc files (renamed? update the rules)")
        # A file belongs to the longest rule folder that contains it.
        for path in files:
            rel = path.relative_to(root).as_posix()
            owner = max((f for f in RULES if rel.startswith(f)), key=len)
            if owner != folder:
                continue
            for match in INCLUDE.finditer(path.read_text(encoding="utf-8")):
                target = match.group(1)
                if not (root / target).exists():
                    continue  # a system header spelt with quotes: not ours
                if target.startswith(folder) or any(target.startswith(a) for a in allowed):
                    continue
                errors.append(f"{rel}: includes {target}, which {folder} may not use "
                              f"(allowed: {folder} and {', '.join(allowed) or 'nothing else'})")
    for error in errors:
        print(error)
    if not errors:
        print(f"{len(RULES)} folders: every include follows the layering")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
