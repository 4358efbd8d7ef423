#!/usr/bin/python3
"""Reference decoder of a vipsd release directory (docs/release_format.md).

Usage:  decode_release.py RELEASE_DIR [--json]
As a module:  metadata, arrays = load_release(path)

Checks every array file's size and BLAKE2b-256 against manifest.json, loads it
with numpy (no pickles) and checks its shape. Prints a summary (or one JSON
object with --json). Exit 1 with a one-line error on any mismatch.
Needs only Python 3 and numpy.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np

SUPPORTED_SCHEMA = 1


class ReleaseError(Exception):
    pass


def load_release(path):
    """-> (metadata dict without "arrays", {name: numpy array})."""
    manifest_path = os.path.join(path, "manifest.json")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ReleaseError("%s: cannot read manifest: %s" % (manifest_path, e))
    if manifest.get("schema_version") != SUPPORTED_SCHEMA:
        raise ReleaseError("%s: schema_version %r is not %d" % (manifest_path, manifest.get("schema_version"), SUPPORTED_SCHEMA))
    arrays = {}
    for entry in manifest.get("arrays", []):
        file_path = os.path.join(path, entry["file"])
        try:
            with open(file_path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ReleaseError("%s: %s" % (file_path, e))
        if len(data) != entry["bytes"]:
            raise ReleaseError("%s: %d bytes, manifest says %d" % (file_path, len(data), entry["bytes"]))
        if hashlib.blake2b(data, digest_size=32).hexdigest() != entry["blake2b"]:
            raise ReleaseError("%s: BLAKE2b does not match the manifest" % file_path)
        with open(file_path, "rb") as f:
            array = np.load(f, allow_pickle=False)
        if list(array.shape) != list(entry["shape"]) or array.dtype != np.dtype(entry["dtype"]):
            raise ReleaseError("%s: shape %s dtype %s, manifest says %s %s" % (
                file_path, list(array.shape), array.dtype, entry["shape"], entry["dtype"]))
        arrays[entry["name"]] = array
    metadata = {k: v for k, v in manifest.items() if k != "arrays"}
    return metadata, arrays


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("release_dir")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    try:
        metadata, arrays = load_release(args.release_dir)
    except ReleaseError as e:
        print("decode_release: %s" % e, file=sys.stderr)
        return 1
    summary = dict(metadata)
    summary["arrays"] = {name: {"shape": list(a.shape), "min": float(a.min()), "max": float(a.max()),
                                "sum": float(a.sum())} for name, a in arrays.items()}
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in metadata.items():
            print("%-24s %s" % (key, value))
        for name, info in summary["arrays"].items():
            print("array %-18s shape=%s min=%.6g max=%.6g" % (name, info["shape"], info["min"], info["max"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
