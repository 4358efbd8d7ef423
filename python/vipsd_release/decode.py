r"""Reference decoder of vipsd releases (docs/release_format.md): the one
implementation behind the `vipsd_release` package, tools/decode_release.py
and the `vipsd-decode-release` command.

Usage:
  decode_release.py RELEASE_DIR [--json [--values]]
  decode_release.py --kcat DUMP [--release-id ID] [--json [--values]] [--extract DIR]
As a module (vipsd_release.decode):
  metadata, arrays = load_release(path)
  for manifest, arrays, files in load_kcat_releases(dump_bytes): ...

Directory mode reads RELEASE_DIR/manifest.json, checks its format, schema
version and fields, then for every array checks the file's size and
BLAKE2b-256 against the manifest, loads it with numpy (allow_pickle=False)
and checks dtype, order, shape and finiteness. Prints a summary (metadata,
then each array's shape, min and max), or with --json one JSON object: the
metadata fields plus "arrays": {name: {shape, dtype, min, max, sum,
blake2b}} (--values adds each array's values, flattened in C order). Any
mismatch: a one-line error on stderr and exit status 1.

Kafka mode (--kcat) reads a dump of the release topic written by kcat 1.7
with exactly this format (length-prefixed, so binary chunks survive):

  kcat -C -b BROKERS -t TOPIC -o beginning -e -q \
       -f 'vipsd-kcat %p %o %K %S\n%k\n%h\n%s\n' > DUMP

and reassembles the releases as the C++ ReleaseAssembler does: chunks are
buffered per (vipsd-release-id, vipsd-file) and ordered by vipsd-chunk; when
a manifest.json message arrives, its release is complete only if every file
has all vipsd-chunks chunks; the files are then verified exactly as in
directory mode. A repeated chunk replaces the earlier copy; a chunk with a
different vipsd-chunks restarts its file. Every release that completes is
printed (--json: one JSON object per line; --release-id: only that release,
the last copy if it was published twice) and, with --extract, written to
DIR/<release_id>/ as a release directory. A release whose manifest arrives
but which is incomplete or does not verify is an error (one line on stderr,
exit status 1 after the other releases are printed); chunks whose manifest
never arrived (a failed publication) only give a warning. kcat prints
headers as "name=value,..." (no escaping): vipsd's release headers never
contain ',' or '='. Needs only Python 3 and numpy.
"""
import argparse
import hashlib
import io
import json
import math
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
# Added within schema 1 (older releases lack them); checked when present.
OPTIONAL_METADATA_FIELDS = {"schedule": str, "conversion": str, "vocabulary_source": str,
                            "public_prior_fingerprint": str, "public_prior_source": str,
                            "public_prior_weight": _NUMBER,
                            "hyperparameters": dict, "privacy_unit": str, "unit_field": str,
                            "max_records_per_unit": int}
_UNIT_FIELD = re.compile(r"[A-Za-z0-9_.\-]{1,128}\Z")
ARRAY_FIELDS = {"name": str, "shape": list, "dtype": str, "file": str, "bytes": int, "blake2b": str}
_ARRAY_NAME = re.compile(r"[a-z0-9_]{1,64}\Z")
_HEX256 = re.compile(r"[0-9a-f]{64}\Z")


class ReleaseError(Exception):
    """The release directory does not match its manifest or the format."""


class _NpyProblem(Exception):
    """What is wrong with an .npy file, in one line (internal)."""


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


# The same limits as the C++ reader (connectors/file/release_reader.h).
MAX_MANIFEST_BYTES = 1 << 20
MAX_MANIFEST_DEPTH = 16


def _max_depth(text):
    """Nesting depth of JSON text (brackets outside strings), without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "}]":
            depth -= 1
    return deepest


def _refuse_constant(name):
    raise ReleaseError("%s is not a JSON number" % name)


def _parse_manifest(raw, manifest_path):
    """Parses and checks manifest bytes; manifest_path labels the errors."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ReleaseError("%s: larger than 1 MiB" % manifest_path)
    try:
        text = raw.decode("utf-8")
    except ValueError as e:
        raise ReleaseError("%s: not UTF-8: %s" % (manifest_path, e))
    if _max_depth(text) > MAX_MANIFEST_DEPTH:
        raise ReleaseError("%s: nested deeper than %d levels" % (manifest_path, MAX_MANIFEST_DEPTH))
    try:
        manifest = json.loads(text, object_pairs_hook=_no_duplicate_keys,
                              parse_constant=_refuse_constant)
    except ReleaseError as e:
        raise ReleaseError("%s: %s" % (manifest_path, e))
    except (ValueError, RecursionError) as e:
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
    for key, expected in OPTIONAL_METADATA_FIELDS.items():
        if key in manifest and not _has_type(manifest[key], expected):
            raise ReleaseError("%s: field %r has the wrong type" % (manifest_path, key))
    for key, value in manifest["clip_bounds"].items():
        if not _has_type(value, _NUMBER):
            raise ReleaseError("%s: clip_bounds[%r] is not a number" % (manifest_path, key))
    for key, value in manifest["dimensions"].items():
        if not _has_type(value, int):
            raise ReleaseError("%s: dimensions[%r] is not an integer" % (manifest_path, key))
    if not isinstance(manifest.get("arrays"), list) or not manifest["arrays"]:
        raise ReleaseError("%s: 'arrays' must be a non-empty list" % manifest_path)
    problem = _metadata_problem(manifest)
    if problem:
        raise ReleaseError("%s: release metadata: %s" % (manifest_path, problem))
    return manifest


# The writer's rules (core/release/release.cc Validate), applied to what is
# read; tests/tools/release_readers_agree_test.sh keeps the two in step.
_RELEASE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_LOWER_NAME = re.compile(r"[a-z0-9_]{1,64}\Z")
_KEY_NAME = re.compile(r"[A-Za-z0-9_]{1,64}\Z")
_RFC3339 = re.compile(
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:"
    r"([0-5][0-9]|60)(\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])\Z")
_INT64_MAX = (1 << 63) - 1


def _finite(x):
    return x == x and x not in (float("inf"), float("-inf"))


def _metadata_problem(m):
    """The first rule the metadata breaks, or None."""
    if not _RELEASE_ID_RE.match(m["release_id"]):
        return "release_id must be 1-128 characters of [A-Za-z0-9_.-] starting with a letter or digit"
    if m["model_type"] not in ("lda", "blr", "sbn"):
        return "model_type must be \"lda\", \"blr\" or \"sbn\""
    if not 0 <= m["step"] <= _INT64_MAX:
        return "step must be an integer in [0, 2^63 - 1], got %s" % (
            m["step"] if abs(m["step"]) < 10 ** 30 else "an integer of %d digits" % len(str(abs(m["step"]))))
    if not 0 < m["rho"] <= 1:
        return "rho must be in (0, 1]"
    if not (_finite(m["epsilon_spent"]) and m["epsilon_spent"] >= 0):
        return "epsilon_spent must be finite and >= 0"
    if not 0 <= m["delta"] < 1:
        return "delta must be in [0, 1)"
    if not (_finite(m["noise_multiplier"]) and m["noise_multiplier"] >= 0):
        return "noise_multiplier must be finite and >= 0"
    if not 0 < m["sampling_rate"] <= 1:
        return "sampling_rate must be in (0, 1]"
    if not _LOWER_NAME.match(m["accountant"]):
        return "accountant must be 1-64 characters of [a-z0-9_]"
    # Releases written before these fields existed: "unrecorded".
    schedule = m.get("schedule", "unrecorded")
    conversion = m.get("conversion", "unrecorded")
    if schedule not in ("fixed", "adaptive", "none", "unrecorded"):
        return "schedule must be \"fixed\", \"adaptive\" or \"none\""
    if not _LOWER_NAME.match(conversion):
        return "conversion must be 1-64 characters of [a-z0-9_]"
    for name, bound in m["clip_bounds"].items():
        if not _KEY_NAME.match(name):
            return "clip_bounds must be keyed by names of [A-Za-z0-9_] (1-64)"
        if not (_finite(bound) and bound >= 0):
            return "clip_bounds.%s must be finite and >= 0" % name
    for name, value in m["dimensions"].items():
        if not _KEY_NAME.match(name):
            return "dimensions must be keyed by names of [A-Za-z0-9_] (1-64)"
        if value > _INT64_MAX or value < 0 or (value == 0 and name != "N"):
            return "dimensions.%s must be %s" % (name, ">= 0" if name == "N" else ">= 1")
    if m["vocabulary_fingerprint"] and not _HEX256.match(m["vocabulary_fingerprint"]):
        return "vocabulary_fingerprint must be empty or 64 lowercase hex characters"
    if not _HEX256.match(m["config_fingerprint"]):
        return "config_fingerprint must be 64 lowercase hex characters"
    source = m.get("vocabulary_source", "")
    if len(source) > 4096 or not all(" " <= c <= "~" for c in source):
        return "vocabulary_source must be 0-4096 printable ASCII characters"
    prior = m.get("public_prior_fingerprint", "")
    if prior and not _HEX256.match(prior):
        return "public_prior_fingerprint must be empty or 64 lowercase hex characters"
    prior_source = m.get("public_prior_source", "")
    if (len(prior_source) > 4096 or not all(" " <= c <= "~" for c in prior_source)
            or (prior_source and not prior)):
        return ("public_prior_source must be 0-4096 printable ASCII characters, and empty "
                "without a public_prior_fingerprint")
    weight = m.get("public_prior_weight", 0)
    if not (weight == 0 or 0 < weight <= 1) or (weight != 0 and not prior):
        return ("public_prior_weight must be 0 (none) or in (0, 1], and 0 without a "
                "public_prior_fingerprint")
    for name, value in m.get("hyperparameters", {}).items():
        if not _KEY_NAME.match(name):
            return "hyperparameters must be keyed by names of [A-Za-z0-9_] (1-64)"
        if not _has_type(value, _NUMBER) or not math.isfinite(value) or not value > 0:
            return "hyperparameters.%s must be a finite number > 0" % name
    # What the epsilon protects (privacy.unit): absent is one record.
    unit = m.get("privacy_unit", "record")
    if "privacy_unit" in m and unit == "record":
        return "privacy_unit record is written by leaving it out"
    if unit not in ("record", "key", "field"):
        return "privacy_unit must be record, key or field"
    field = m.get("unit_field", "")
    if not (_UNIT_FIELD.match(field) if unit == "field" else field == ""):
        return "unit_field must be 1-128 of [A-Za-z0-9_.-] with privacy_unit field, empty otherwise"
    cap = m.get("max_records_per_unit", 0)
    if not (cap == 0 if unit == "record" else 1 <= cap <= 1000000):
        return "max_records_per_unit must be in [1, 1000000] with a privacy unit, 0 with privacy_unit record"
    description = m["noise_description"]
    if not (1 <= len(description) <= 256 and all(" " <= c <= "~" for c in description)):
        return "noise_description must be 1-256 printable ASCII characters"
    if not _RFC3339.match(m["created_at_utc"]):
        return "created_at_utc must be an RFC 3339 date-time such as 2026-01-31T12:00:00Z"
    if m["is_private"]:
        if not m["noise_multiplier"] > 0:
            return "noise_multiplier must be > 0 when is_private"
        for key, value in (("accountant", m["accountant"]), ("schedule", schedule),
                           ("conversion", conversion)):
            if value == "none":
                return "%s must not be \"none\" when is_private" % key
        if not m["delta"] > 0:
            return "delta must be > 0 when is_private"
        if not m["clip_bounds"]:
            return "clip_bounds must be non-empty when is_private"
        for name, bound in m["clip_bounds"].items():
            if not bound > 0:
                return "clip_bounds.%s must be > 0 when is_private" % name
    return None


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
    manifest_path = os.path.join(path, MANIFEST)
    try:
        with open(manifest_path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ReleaseError("%s: cannot read: %s" % (manifest_path, e))
    manifest = _parse_manifest(raw, manifest_path)

    def read_file(name):
        file_path = os.path.join(path, name)
        try:
            with open(file_path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ReleaseError("%s: cannot read: %s" % (file_path, e.strerror))

    return manifest, _verify_arrays(manifest, manifest_path, read_file, lambda name: os.path.join(path, name))


def _verify_arrays(manifest, manifest_path, read_file, label):
    """Checks every array of a parsed manifest against its file bytes.

    read_file(name) returns the bytes of file `name` (or raises
    ReleaseError); label(name) names the file in error messages. Returns
    {array name: numpy array} in manifest order.
    """
    arrays = {}
    for index, entry in enumerate(manifest["arrays"]):
        _check_entry(manifest_path, index, entry, arrays)
        file_path = label(entry["file"])
        data = read_file(entry["file"])
        if len(data) != entry["bytes"]:
            raise ReleaseError("%s: %d bytes, manifest says %d" % (file_path, len(data), entry["bytes"]))
        if hashlib.blake2b(data, digest_size=32).hexdigest() != entry["blake2b"]:
            raise ReleaseError("%s: BLAKE2b-256 does not match the manifest" % file_path)
        try:
            # Parse the verified bytes, not the file again.
            stream = io.BytesIO(data)
            try:
                magic = np.lib.format.read_magic(stream)
            except Exception:
                raise _NpyProblem("it does not start with the .npy magic string")
            if magic != (1, 0):
                raise _NpyProblem("only .npy version 1.0 is supported")
            try:
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
            except Exception:
                # numpy's own messages quote the damaged header or a Python
                # tokenizer tuple: say what is wrong, in one line.
                raise _NpyProblem("its header is not a valid .npy header (a Python dict "
                                  "literal with 'descr', 'fortran_order' and 'shape')")
            header_end = stream.tell()
            if fortran_order:
                raise _NpyProblem("fortran_order is not False")
            if dtype != np.dtype("<f8"):
                raise _NpyProblem("dtype %s is not '<f8'" % dtype.str)
            count = 1
            for dim in shape:
                count *= dim
            if len(data) != header_end + 8 * count:
                raise _NpyProblem("%d bytes after the header, the shape needs %d"
                                  % (len(data) - header_end, 8 * count))
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ReleaseError:
            raise
        except _NpyProblem as e:
            raise ReleaseError("%s: not a valid .npy file: %s" % (file_path, e))
        except Exception as e:  # anything else numpy refuses: one clear line, never a traceback
            raise ReleaseError("%s: not a valid .npy file (%s)" % (file_path, type(e).__name__))
        if array.dtype != np.dtype("<f8"):
            raise ReleaseError("%s: dtype %s is not '<f8'" % (file_path, array.dtype.str))
        if array.ndim > 1 and not array.flags.c_contiguous:
            raise ReleaseError("%s: not in C order" % file_path)
        if list(array.shape) != entry["shape"]:
            raise ReleaseError("%s: shape %s, manifest says %s" % (file_path, list(array.shape), entry["shape"]))
        if not np.all(np.isfinite(array)):
            raise ReleaseError("%s: contains non-finite values" % file_path)
        arrays[entry["name"]] = array
    return arrays


# ---- Kafka: kcat dumps of the release topic --------------------------------

KCAT_FORMAT = r"vipsd-kcat %p %o %K %S\n%k\n%h\n%s\n"
_KCAT_RECORD = re.compile(rb"vipsd-kcat (\d+) (\d+) (-1|\d+) (-1|\d+)\n")
_RELEASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,8})\Z")
_MAX_CHUNKS = 1 << 20


class KafkaMessage(object):
    """One message of a kcat dump: partition, offset, key (bytes or None),
    headers (list of (name, value) str pairs), value (bytes or None)."""

    def __init__(self, partition, offset, key, headers, value):
        self.partition = partition
        self.offset = offset
        self.key = key
        self.headers = headers
        self.value = value


def read_kcat_dump(data):
    """Splits a dump written with KCAT_FORMAT into KafkaMessage objects."""
    messages = []
    pos = 0
    while pos < len(data):
        match = _KCAT_RECORD.match(data, pos)
        if not match:
            raise ReleaseError("kcat dump: byte %d: expected a 'vipsd-kcat P O K S' line "
                               "(dump with -f '%s')" % (pos, KCAT_FORMAT))
        partition, offset, key_len, value_len = (int(g) for g in match.groups())
        pos = match.end()
        where = "kcat dump: partition %d offset %d" % (partition, offset)
        key = None
        if key_len >= 0:
            key = data[pos:pos + key_len]
            pos += key_len
        if data[pos:pos + 1] != b"\n":
            raise ReleaseError("%s: truncated key" % where)
        pos += 1
        end = data.find(b"\n", pos)
        if end < 0:
            raise ReleaseError("%s: truncated headers" % where)
        headers = []
        line = data[pos:end].decode("utf-8", errors="replace")
        if line:
            for item in line.split(","):
                name, sep, value = item.partition("=")
                if not sep:
                    raise ReleaseError("%s: header %r is not name=value" % (where, item[:64]))
                headers.append((name, value))
        pos = end + 1
        value = None
        if value_len >= 0:
            if pos + value_len > len(data):
                raise ReleaseError("%s: truncated value" % where)
            value = data[pos:pos + value_len]
            pos += value_len
        if data[pos:pos + 1] != b"\n":
            raise ReleaseError("%s: value is not followed by a newline (dump format?)" % where)
        pos += 1
        messages.append(KafkaMessage(partition, offset, key, headers, value))
    return messages


def assemble_releases(messages):
    """Reassembles releases from release-topic messages (in topic order).

    Returns (releases, errors, warnings): releases is a list of
    (release_id, manifest_bytes, {file name: bytes}) for every manifest
    whose files are all complete; errors lists the releases dropped at their
    manifest; warnings the ignored messages and the releases whose manifest
    never arrived.
    """
    pending = {}  # release id -> {file: [chunk count, {index: bytes}]}
    releases, errors, warnings = [], [], []
    for m in messages:
        where = "partition %d offset %d" % (m.partition, m.offset)
        fields = {}
        duplicate = False
        for name, value in m.headers:
            if name.startswith("vipsd-"):
                duplicate = duplicate or name in fields
                fields[name] = value
        release_id, file_name = fields.get("vipsd-release-id"), fields.get("vipsd-file")
        if duplicate or release_id is None or file_name is None:
            warnings.append("%s: not a release message, ignored" % where)
            continue
        if not _RELEASE_ID.match(release_id) or m.key != release_id.encode("ascii"):
            warnings.append("%s: bad release id or key differs from vipsd-release-id, ignored" % where)
            continue
        value = m.value if m.value is not None else b""
        if file_name == MANIFEST:
            files = pending.pop(release_id, {})
            assembled = {}
            problem = None
            for name, (count, chunks) in files.items():
                missing = [i for i in range(count) if i not in chunks]
                if missing:
                    problem = "%s: chunk %d of %d missing" % (name, missing[0], count)
                    break
                assembled[name] = b"".join(chunks[i] for i in range(count))
            if problem:
                errors.append("release %s dropped: %s" % (release_id, problem))
            else:
                releases.append((release_id, value, assembled))
            continue
        if not (file_name.endswith(".npy") and _ARRAY_NAME.match(file_name[:-4])):
            warnings.append("%s: vipsd-file %r is neither manifest.json nor <array>.npy, ignored"
                            % (where, file_name[:64]))
            continue
        chunk, count = fields.get("vipsd-chunk", ""), fields.get("vipsd-chunks", "")
        if not (_DECIMAL.match(chunk) and _DECIMAL.match(count)) or not (
                0 <= int(chunk) < int(count) <= _MAX_CHUNKS):
            warnings.append("%s: bad vipsd-chunk / vipsd-chunks, ignored" % where)
            continue
        entry = pending.setdefault(release_id, {}).setdefault(file_name, [int(count), {}])
        if entry[0] != int(count):
            warnings.append("release %s file %s: chunk count changed from %d to %s; earlier chunks "
                            "discarded" % (release_id, file_name, entry[0], count))
            entry[0], entry[1] = int(count), {}
        entry[1][int(chunk)] = value
    for release_id in pending:
        warnings.append("release %s incomplete: its manifest never arrived, ignored" % release_id)
    return releases, errors, warnings


def _verify_assembled(release_id, manifest_bytes, files):
    label = lambda name: name
    manifest = _parse_manifest(manifest_bytes, label(MANIFEST))
    if manifest["release_id"] != release_id:
        raise ReleaseError("%s: release_id %r differs from vipsd-release-id"
                           % (label(MANIFEST), manifest["release_id"]))

    def read_file(name):
        if name not in files:
            raise ReleaseError("%s: no chunk received" % label(name))
        return files[name]

    arrays = _verify_arrays(manifest, label(MANIFEST), read_file, label)
    extra = sorted(set(files) - set(e["file"] for e in manifest["arrays"]))
    if extra:
        raise ReleaseError("%s is not listed in the manifest" % label(extra[0]))
    return manifest, arrays


def load_kcat_releases(dump, errors=None, warnings=None):
    """Verified releases of a kcat dump (bytes), in manifest order.

    Returns a list of (manifest, arrays, files): the parsed manifest (with
    "arrays"), {name: numpy array}, and {file name: bytes} including
    manifest.json. Releases that fail are left out; their messages are
    appended to `errors` (and ignored messages to `warnings`) when given.
    """
    releases, assemble_errors, assemble_warnings = assemble_releases(read_kcat_dump(dump))
    if errors is not None:
        errors.extend(assemble_errors)
    if warnings is not None:
        warnings.extend(assemble_warnings)
    out = []
    for release_id, manifest_bytes, files in releases:
        try:
            manifest, arrays = _verify_assembled(release_id, manifest_bytes, files)
        except ReleaseError as e:
            if errors is not None:
                errors.append("release %s dropped: %s" % (release_id, e))
            continue
        files = dict(files)
        files[MANIFEST] = manifest_bytes
        out.append((manifest, arrays, files))
    return out


def _extract(directory, manifest, files):
    """Writes a verified release as DIR/<release_id>/ (files, then manifest)."""
    target = os.path.join(directory, manifest["release_id"])
    os.makedirs(target, exist_ok=True)
    names = [e["file"] for e in manifest["arrays"]] + [MANIFEST]
    for name in names:
        with open(os.path.join(target, name), "wb") as f:
            f.write(files.get(name, b""))


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


def _print_text(summary):
    for key, value in summary.items():
        if key != "arrays":
            print("%-24s %s" % (key, value))
    for name, info in summary["arrays"].items():
        print("array %-18s shape=%s min=%s max=%s" % (
            name, info["shape"],
            "%.6g" % info["min"] if info["min"] is not None else "-",
            "%.6g" % info["max"] if info["max"] is not None else "-"))


def _error(message):
    print("decode_release: %s" % str(message).replace("\n", " "), file=sys.stderr)


def _main_kcat(args):
    try:
        with open(args.kcat, "rb") as f:
            dump = f.read()
    except OSError as e:
        _error("%s: cannot read: %s" % (args.kcat, e.strerror))
        return 1
    errors, warnings = [], []
    try:
        releases = load_kcat_releases(dump, errors, warnings)
    except ReleaseError as e:
        _error(e)
        return 1
    if args.release_id is not None:
        releases = [r for r in releases if r[0]["release_id"] == args.release_id][-1:]
        if not releases:
            errors.append("release %s: no complete, verified copy in %s" % (args.release_id, args.kcat))
    for warning in warnings:
        _error("warning: " + warning)
    for manifest, arrays, files in releases:
        if args.extract:
            try:
                _extract(args.extract, manifest, files)
            except OSError as e:
                errors.append("cannot extract release %s: %s" % (manifest["release_id"], e))
        summary = summarize(manifest, arrays, values=args.values)
        if args.json:
            print(json.dumps(summary, allow_nan=False))
        else:
            _print_text(summary)
    for error in errors:
        _error(error)
    return 1 if errors else 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Verify and summarise vipsd releases: a release directory (manifest.json + "
                    ".npy files) or, with --kcat, the releases in a kcat dump of the release topic.",
        epilog="Exit status: 0 if everything verifies, 1 with one-line errors otherwise. "
               "Kafka dumps: kcat -C -b BROKERS -t TOPIC -o beginning -e -q -f '%s'" % KCAT_FORMAT)
    parser.add_argument("release_dir", nargs="?", help="directory holding manifest.json and the .npy files")
    parser.add_argument("--kcat", metavar="DUMP", help="read releases from a kcat dump of the release topic")
    parser.add_argument("--release-id", help="with --kcat: only this release (its last complete copy)")
    parser.add_argument("--extract", metavar="DIR",
                        help="with --kcat: write each verified release to DIR/<release_id>/")
    parser.add_argument("--json", action="store_true",
                        help="print JSON (one object; with --kcat one object per line) instead of text")
    parser.add_argument("--values", action="store_true",
                        help="with --json: include every array's values (flattened, C order)")
    args = parser.parse_args(argv)
    if (args.release_dir is None) == (args.kcat is None):
        parser.error("give either RELEASE_DIR or --kcat DUMP")
    if args.kcat is None and (args.release_id is not None or args.extract is not None):
        parser.error("--release-id and --extract need --kcat")
    if args.kcat is not None:
        return _main_kcat(args)
    try:
        manifest, arrays = _load(args.release_dir)
    except ReleaseError as e:
        _error(e)
        return 1
    summary = summarize(manifest, arrays, values=args.values)
    if args.json:
        print(json.dumps(summary, allow_nan=False))
        return 0
    _print_text(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
