#!/usr/bin/python3
"""Split a prepared Wikipedia training file into a public slice and the private rest.

  bench/public_slice.py TRAIN_IDS.jsonl OUT_DIR [--per-256 5]

The public slice is every paragraph of the articles whose id hashes below
the threshold: sha256("public:" + article)[0] < per-256 (5 → about 1.95 % of
the articles). An article is the paragraph id up to its last "_p"
("enwiki123_p4" → "enwiki123"), as bench/lda_svi_run --unit-cap reads it.
The rest is the private training file, so the two never share an article
and the private unit counts leave the public articles out. Writes
OUT_DIR/public_ids.jsonl and OUT_DIR/private_ids.jsonl (idempotent: existing
files are kept) and prints the counts as JSON.
"""
import hashlib
import json
import os
import sys


def article(paragraph_id):
    cut = paragraph_id.rfind("_p")
    return paragraph_id if cut < 0 else paragraph_id[:cut]


def is_public(paragraph_id, per_256):
    return hashlib.sha256(("public:" + article(paragraph_id)).encode()).digest()[0] < per_256


def main():
    args = sys.argv[1:]
    per_256 = 5
    if "--per-256" in args:
        at = args.index("--per-256")
        per_256 = int(args[at + 1])
        del args[at:at + 2]
    if len(args) != 2 or not 1 <= per_256 <= 255:
        sys.exit("usage: bench/public_slice.py TRAIN_IDS.jsonl OUT_DIR [--per-256 1..255]")
    train, out = args
    os.makedirs(out, exist_ok=True)
    public_path = os.path.join(out, "public_ids.jsonl")
    private_path = os.path.join(out, "private_ids.jsonl")
    counts = {"public_paragraphs": 0, "private_paragraphs": 0}
    articles = {"public": set(), "private": set()}
    if os.path.exists(public_path) and os.path.exists(private_path):
        for name, path in (("public", public_path), ("private", private_path)):
            with open(path) as f:
                for line in f:
                    counts[name + "_paragraphs"] += 1
                    articles[name].add(article(json.loads(line)["id"]))
    else:
        with open(train) as f, open(public_path + ".tmp", "w") as pub, \
                open(private_path + ".tmp", "w") as priv:
            for line in f:
                paragraph = json.loads(line)["id"]
                name = "public" if is_public(paragraph, per_256) else "private"
                (pub if name == "public" else priv).write(line)
                counts[name + "_paragraphs"] += 1
                articles[name].add(article(paragraph))
        os.replace(public_path + ".tmp", public_path)
        os.replace(private_path + ".tmp", private_path)
    counts["public_articles"] = len(articles["public"])
    counts["private_articles"] = len(articles["private"])
    counts["shared_articles"] = len(articles["public"] & articles["private"])
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
