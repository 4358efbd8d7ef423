#!/usr/bin/python3
"""Reference decoder of vipsd releases: the command-line face of the
`vipsd_release` package (python/vipsd_release/decode.py holds the one
implementation; `pip install ./python` installs it as vipsd-decode-release).
Runs from the source tree without installing anything; usage: --help.
Importable as a module too (tests/harness use read_kcat_dump,
load_kcat_releases, load_release)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from vipsd_release.decode import *  # noqa: E402,F401,F403
from vipsd_release.decode import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
