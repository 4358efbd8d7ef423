#!/usr/bin/python3
"""Reference decoder of a vipsd release directory (docs/release_format.md).

Usage:  decode_release.py RELEASE_DIR [--json [--values]]
As a module:  metadata, arrays = load_release(path)

Reads RELEASE_DIR/manifest.json, checks its format, schema version and
fields, then for every array checks the file's size and BLAKE2b-256 against
the manifest, loads it with numpy (allow_pickle=False) and checks dtype,
order, shape and finiteness. Prints a summary (metadata, then each array's
shape, min and max), or with --json one JSON object: the metadata fields
plus "arrays": {name: {shape, dtype, min, max, sum, blake2b}} (--values adds
each array's values, flattened in C order). Any mismatch: a one-line error
on stderr and exit status 1. Needs only Python 3 and numpy.
"""
import argparse
import hashlib
import io
import json
import os
import re
import sys

import numpy as np

FORMAT = "vipsd-release"
SUPPORTED_SCHEMA = 1
MANIFEST = "manifest.json"

# Metadata fields of schema 1 and their JSON types. Unknown extra fields are
# allowed (adding a field is a compatible change) and passed through.
_NUMBER = (int, float)
METADATA_FIELDS = {
    "format": str,
    "schema_version": int,
    "release_id": str,
    "model_type": str,
    "step": int,
    "rho": _NUMBER,
    "epsilon_spent": _NUMBER,
    "delta": _NUMBER,
    "noise_multiplier": _NUMBER,
    "sampling_rate": _NUMBER,
    "accountant": str,
    "clip_bounds": dict,
    "dimensions": dict,
    "vocabulary_fingerprint": str,
    "config_fingerprint": str,
    "is_private": bool,
    "noise_description": str,
    "created_at_utc": str,
}
ARRAY_FIELDS = {"name": str, "shape": list, "dtype": str, "file": str, "bytes": int, "blake2b": str}
_ARRAY_NAME = re.compile(r"[a-z0-9_]{1,64}\Z")
_HEX256 = re.compile(r"[0-9a-f]{64}\Z")


class ReleaseError(Exception):
    """The release directory does not match its manifest or the format."""


def _has_type(value, expected):
    # bool is a subclass of int in Python; JSON keeps them apart.
    if isinstance(value, bool) and expected is not bool:
        return False
    return isinstance(value, expected)


def _no_duplicate_keys(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise ReleaseError("duplicate key %r" % key)
        result[key] = value
    return result


def _read_manifest(path):
    manifest_path = os.path.join(path, MANIFEST)
    try:
        with open(manifest_path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except ReleaseError as e:
        raise ReleaseError("%s: %s" % (manifest_path, e))
    except (OSError, ValueError) as e:
        raise ReleaseError("%s: cannot read: %s" % (manifest_path, e))
    if not isinstance(manifest, dict):
        raise ReleaseError("%s: not a JSON object" % manifest_path)
    if manifest.get("format") != FORMAT:
        raise ReleaseError("%s: format is %r, expected %r" % (manifest_path, manifest.get("format"), FORMAT))
    version = manifest.get("schema_version")
    if not _has_type(version, int) or version != SUPPORTED_SCHEMA:
        raise ReleaseError("%s: schema_version %r is not supported (this decoder reads %d)"
                           % (manifest_path, version, SUPPORTED_SCHEMA))
    for key, expected in METADATA_FIELDS.items():
        if key not in manifest:
            raise ReleaseError("%s: missing field %r" % (manifest_path, key))
        if not _has_type(manifest[key], expected):
            raise ReleaseError("%s: field %r has the wrong type" % (manifest_path, key))
    for key, value in manifest["clip_bounds"].items():
        if not _has_type(value, _NUMBER):
            raise ReleaseError("%s: clip_bounds[%r] is not a number" % (manifest_path, key))
    for key, value in manifest["dimensions"].items():
        if not _has_type(value, int):
            raise ReleaseError("%s: dimensions[%r] is not an integer" % (manifest_path, key))
    if not isinstance(manifest.get("arrays"), list) or not manifest["arrays"]:
        raise ReleaseError("%s: 'arrays' must be a non-empty list" % manifest_path)
    return manifest_path, manifest


def _check_entry(manifest_path, index, entry, seen):
    where = "%s: arrays[%d]" % (manifest_path, index)
    if not isinstance(entry, dict):
        raise ReleaseError("%s is not an object" % where)
    for key, expected in ARRAY_FIELDS.items():
        if key not in entry or not _has_type(entry[key], expected):
            raise ReleaseError("%s: missing or mistyped %r" % (where, key))
    name = entry["name"]
    if not _ARRAY_NAME.match(name) or name in seen:
        raise ReleaseError("%s: bad or repeated name %r" % (where, name))
    # The file name is derived, never trusted: no path can escape the directory.
    if entry["file"] != name + ".npy":
        raise ReleaseError("%s: file %r is not %r" % (where, entry["file"], name + ".npy"))
    if entry["dtype"] != "<f8":
        raise ReleaseError("%s: dtype %r is not '<f8'" % (where, entry["dtype"]))
    if not all(_has_type(d, int) and d >= 0 for d in entry["shape"]):
        raise ReleaseError("%s: shape %r is not a list of integers >= 0" % (where, entry["shape"]))
    if not _HEX256.match(entry["blake2b"]):
        raise ReleaseError("%s: blake2b is not 64 lowercase hex characters" % where)


def load_release(path):
    """Verifies and loads a release directory.

    Returns (metadata, arrays): metadata is the manifest without "arrays";
    arrays maps each array name to a float64 numpy array, in manifest order.
    Raises ReleaseError on any mismatch.
    """
    manifest, arrays = _load(path)
    metadata = {k: v for k, v in manifest.items() if k != "arrays"}
    return metadata, arrays


def _load(path):
    manifest_path, manifest = _read_manifest(path)
    arrays = {}
    for index, entry in enumerate(manifest["arrays"]):
        _check_entry(manifest_path, index, entry, arrays)
        file_path = os.path.join(path, entry["file"])
        try:
            with open(file_path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ReleaseError("%s: cannot read: %s" % (file_path, e.strerror))
        if len(data) != entry["bytes"]:
            raise ReleaseError("%s: %d bytes, manifest says %d" % (file_path, len(data), entry["bytes"]))
        if hashlib.blake2b(data, digest_size=32).hexdigest() != entry["blake2b"]:
            raise ReleaseError("%s: BLAKE2b-256 does not match the manifest" % file_path)
        try:
            # Parse the verified bytes, not the file again.
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise ReleaseError("%s: not a valid .npy file: %s" % (file_path, e))
        if array.dtype != np.dtype("<f8"):
            raise ReleaseError("%s: dtype %s is not '<f8'" % (file_path, array.dtype.str))
        if array.ndim > 1 and not array.flags.c_contiguous:
            raise ReleaseError("%s: not in C order" % file_path)
        if list(array.shape) != entry["shape"]:
            raise ReleaseError("%s: shape %s, manifest says %s" % (file_path, list(array.shape), entry["shape"]))
        if not np.all(np.isfinite(array)):
            raise ReleaseError("%s: contains non-finite values" % file_path)
        arrays[entry["name"]] = array
    return manifest, arrays


def _finite_or_none(array):
    # Finite values can still sum past the largest double (e.g. 2 x 1e308).
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(array.sum())
    return total if np.isfinite(total) else None


def summarize(manifest, arrays, values=False):
    """One JSON-serialisable dict: metadata plus per-array statistics."""
    hashes = {e["name"]: e["blake2b"] for e in manifest["arrays"]}
    summary = {k: v for k, v in manifest.items() if k != "arrays"}
    summary["arrays"] = {}
    for name, a in arrays.items():
        info = {
            "shape": list(a.shape),
            "dtype": a.dtype.str,
            "min": float(a.min()) if a.size else None,
            "max": float(a.max()) if a.size else None,
            "sum": _finite_or_none(a),
        }
        info["blake2b"] = hashes[name]
        if values:
            info["values"] = [float(v) for v in a.ravel(order="C")]
        summary["arrays"][name] = info
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Verify and summarise a vipsd release directory (manifest.json + .npy files).",
        epilog="Exit status: 0 if the release verifies, 1 with a one-line error otherwise.")
    parser.add_argument("release_dir", help="directory holding manifest.json and the .npy files")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--values", action="store_true",
                        help="with --json: include every array's values (flattened, C order)")
    args = parser.parse_args(argv)
    try:
        manifest, arrays = _load(args.release_dir)
    except ReleaseError as e:
        print("decode_release: %s" % str(e).replace("\n", " "), file=sys.stderr)
        return 1
    summary = summarize(manifest, arrays, values=args.values)
    if args.json:
        print(json.dumps(summary, allow_nan=False))
        return 0
    for key, value in summary.items():
        if key != "arrays":
            print("%-24s %s" % (key, value))
    for name, info in summary["arrays"].items():
        print("array %-18s shape=%s min=%s max=%s" % (
            name, info["shape"],
            "%.6g" % info["min"] if info["min"] is not None else "-",
            "%.6g" % info["max"] if info["max"] is not None else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
