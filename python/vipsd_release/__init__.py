"""vipsd_release: read the releases vipsd publishes (docs/release_format.md).

    import vipsd_release
    release = vipsd_release.load("releases/step-120")        # a release directory
    releases = vipsd_release.load_kcat_dump("releases.dump")  # every release of a kcat dump
    latest = vipsd_release.read_latest_from_kafka("kafka-1:9092", "releases")

Each is a Release: `arrays` (name -> float64 numpy array, e.g. "lambda" for
LDA), `manifest` (every metadata field: step, epsilon_spent, delta,
accountant, dimensions, hyperparameters such as LDA's alpha and eta,
vocabulary_fingerprint and vocabulary_source, ...), and shortcuts for the
common fields. Every release is verified exactly as the reference decoder
verifies it (format, schema, field ranges, file sizes, BLAKE2b-256 hashes,
strict .npy); anything else raises ReleaseError with one line saying why.

Reading from Kafka needs confluent_kafka (Debian: python3-confluent-kafka);
the rest needs only numpy.
"""
from .decode import (KCAT_FORMAT, KafkaMessage, ReleaseError, assemble_releases,  # noqa: F401
                     load_kcat_releases, load_release, read_kcat_dump, summarize)
from .decode import _verify_assembled

__version__ = "0.1.0"
__all__ = ["Release", "ReleaseError", "load", "load_kcat_dump", "read_latest_from_kafka",
           "releases_from_messages", "lda_noise", "KCAT_FORMAT"]


class Release(object):
    """One verified release: manifest (dict, without "arrays") and arrays
    (dict name -> numpy.ndarray, float64, in manifest order)."""

    def __init__(self, manifest, arrays):
        self.manifest = manifest
        self.arrays = arrays

    release_id = property(lambda self: self.manifest["release_id"])
    model_type = property(lambda self: self.manifest["model_type"])
    step = property(lambda self: self.manifest["step"])
    epsilon_spent = property(lambda self: self.manifest["epsilon_spent"])
    delta = property(lambda self: self.manifest["delta"])
    is_private = property(lambda self: self.manifest["is_private"])
    hyperparameters = property(lambda self: dict(self.manifest.get("hyperparameters", {})))
    # What epsilon_spent protects: "record", "key" or "field" (privacy.unit).
    privacy_unit = property(lambda self: self.manifest.get("privacy_unit", "record"))
    max_records_per_unit = property(lambda self: self.manifest.get("max_records_per_unit", 0))
    dimensions = property(lambda self: dict(self.manifest["dimensions"]))

    def __repr__(self):
        return "Release(%s, %s, step=%d, epsilon_spent=%g, arrays=%s)" % (
            self.release_id, self.model_type, self.step, self.epsilon_spent,
            {name: a.shape for name, a in self.arrays.items()})


def load(path):
    """The release in directory `path` (manifest.json and .npy files)."""
    manifest, arrays = load_release(path)
    return Release(manifest, arrays)


def lda_noise(release):
    """The privacy noise an LDA release states it holds (docs/release_format.md,
    docs/models.md "Noise-aware posteriors"): "floor" (the mass a topic-word
    cell without counts holds from the noise), "floor_sd" (its sd),
    "noise_sd" (the noise sd of a cell whose counts stand clear of 0),
    "noise_share" (K: each topic's share of mass beyond eta that the floor
    accounts for) and "signal" (K x V: (lambda - eta - floor) / floor_sd, the
    cell's mass above the floor in floor sds; below about 2 a cell is not
    distinguishable from noise; inf where there is no noise). Raises
    ReleaseError for a release without these arrays (an LDA release written
    before them, or another model)."""
    import numpy as np
    needed = ("lambda", "noise_floor", "noise_floor_variance", "noise_variance", "noise_share")
    if release.model_type != "lda" or any(n not in release.arrays for n in needed):
        raise ReleaseError("not an LDA release with its noise (arrays %s)" % ", ".join(needed))
    a = release.arrays
    floor = float(a["noise_floor"].reshape(-1)[0])
    floor_sd = float(np.sqrt(a["noise_floor_variance"].reshape(-1)[0]))
    above = a["lambda"] - release.hyperparameters.get("eta", 0.0) - floor
    with np.errstate(invalid="ignore", divide="ignore"):
        signal = above / floor_sd if floor_sd > 0 else np.full(above.shape, np.inf)
    return {"floor": floor, "floor_sd": floor_sd,
            "noise_sd": float(np.sqrt(a["noise_variance"].reshape(-1)[0])),
            "noise_share": a["noise_share"], "signal": signal}


def load_kcat_dump(dump):
    """Every verified release of a kcat dump of the release topic (a path or
    the dump's bytes; the format is KCAT_FORMAT), in the order their
    manifests appear. A release whose manifest arrived but does not verify
    raises ReleaseError; chunks of a release whose manifest never arrived (a
    failed publication) are ignored."""
    if isinstance(dump, (bytes, bytearray)):
        data = bytes(dump)
    else:
        with open(dump, "rb") as f:
            data = f.read()
    errors = []
    loaded = load_kcat_releases(data, errors)
    if errors:
        raise ReleaseError(errors[0])
    return [Release({k: v for k, v in m.items() if k != "arrays"}, arrays)
            for m, arrays, _ in loaded]


def releases_from_messages(messages):
    """Verified releases from KafkaMessage objects in topic order (the
    reassembly of the C++ ReleaseAssembler)."""
    assembled, errors, _ = assemble_releases(messages)
    if errors:
        raise ReleaseError(errors[0])
    out = []
    for release_id, manifest_bytes, files in assembled:
        manifest, arrays = _verify_assembled(release_id, manifest_bytes, files)
        out.append(Release({k: v for k, v in manifest.items() if k != "arrays"}, arrays))
    return out


def read_latest_from_kafka(bootstrap_servers, topic, timeout=30.0, config=None):
    """The latest complete, verified release on `topic` (read from the start
    of its partitions to their current end), or None if there is none.
    `config` adds librdkafka properties (TLS, SASL, ...). Needs
    confluent_kafka (Debian: python3-confluent-kafka)."""
    try:
        from confluent_kafka import Consumer, TopicPartition
    except ImportError:
        raise ReleaseError("reading from Kafka needs confluent_kafka "
                           "(Debian: apt-get install python3-confluent-kafka)")
    import time
    settings = {"bootstrap.servers": bootstrap_servers, "group.id": "vipsd-release-reader",
                "enable.auto.commit": False, "enable.partition.eof": True}
    settings.update(config or {})
    consumer = Consumer(settings)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        if topic not in metadata.topics or metadata.topics[topic].error is not None:
            raise ReleaseError("topic %s not found on %s" % (topic, bootstrap_servers))
        partitions = sorted(metadata.topics[topic].partitions)
        ends, starts = {}, {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                ends[p], starts[p] = high, low
        if not ends:
            return None
        # From each partition's log start: offset 0 may have left it
        # (retention), and an out-of-range offset would reset to the end.
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in ends])
        messages = {p: [] for p in ends}
        deadline = time.monotonic() + timeout
        while any(not messages[p] or messages[p][-1].offset + 1 < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise ReleaseError("timed out reading %s from %s" % (topic, bootstrap_servers))
            m = consumer.poll(1.0)
            if m is None or m.error() is not None:
                continue
            headers = [(name, (value or b"").decode("utf-8", "replace"))
                       for name, value in (m.headers() or [])]
            messages[m.partition()].append(
                KafkaMessage(m.partition(), m.offset(), m.key(), headers, m.value()))
    finally:
        consumer.close()
    releases = []
    for p in sorted(messages):
        releases.extend(releases_from_messages(messages[p]))
    if not releases:
        return None
    return max(releases, key=lambda r: r.step)
