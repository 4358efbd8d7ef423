#!/usr/bin/python3
"""Prepare the Wikipedia paragraph corpus for the LDA experiments (issue 15).

  scripts/prepare_wikipedia.py [DATA_DIR] [OUT_DIR]

DATA_DIR defaults to ../shared/data/wikipedia_paragraphs, OUT_DIR to
out/wikipedia. Writes into OUT_DIR (never into the project):
  train.jsonl        the training file minus the validation articles
  validation.jsonl   every paragraph of 5 % of the training articles, chosen by
                     a hash of the article id (a split by article, as the
                     corpus's own train/test split), for choosing settings
  test.jsonl         a copy of the corpus's test file, used only for the final
                     figures
  *_ids.jsonl        the same files tokenised with the peer kit's tokenizer
  vocab.txt          the corpus vocabulary
Idempotent: a file that exists is not rebuilt.
"""
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys

here = os.path.dirname(os.path.realpath(__file__))
data = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else
                        os.path.join(here, "..", "..", "shared", "data", "wikipedia_paragraphs"))
out = os.path.realpath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "out", "wikipedia"))
peers = os.path.realpath(os.path.join(here, "..", "..", "shared", "peers"))
os.makedirs(out, exist_ok=True)


def article(doc_id):
    # "enwiki14742_p0" -> "enwiki14742": every paragraph of an article on one side
    return doc_id.rsplit("_p", 1)[0]


def in_validation(doc_id):
    return hashlib.sha256(("validation:" + article(doc_id)).encode()).digest()[0] < 13  # ≈ 5 %


if not os.path.exists(os.path.join(out, "validation.jsonl")):
    n_train = n_val = 0
    with gzip.open(os.path.join(data, "train.jsonl.gz"), "rt", encoding="utf-8") as src, \
            open(os.path.join(out, "train.jsonl.tmp"), "w", encoding="utf-8") as train, \
            open(os.path.join(out, "validation.jsonl.tmp"), "w", encoding="utf-8") as val:
        for line in src:
            if not line.strip():
                continue
            if in_validation(json.loads(line)["id"]):
                val.write(line)
                n_val += 1
            else:
                train.write(line)
                n_train += 1
    os.replace(os.path.join(out, "train.jsonl.tmp"), os.path.join(out, "train.jsonl"))
    os.replace(os.path.join(out, "validation.jsonl.tmp"), os.path.join(out, "validation.jsonl"))
    print(json.dumps({"train_docs": n_train, "validation_docs": n_val}))
for name in ("test.jsonl",):
    if not os.path.exists(os.path.join(out, name)):
        shutil.copy(os.path.join(data, name), os.path.join(out, name))
vocab = os.path.join(out, "vocab.txt")
if not os.path.exists(vocab):
    shutil.copy(os.path.join(data, "vocab_train_top10000.txt"), vocab)
for name in ("train", "validation", "test"):
    ids = os.path.join(out, name + "_ids.jsonl")
    if not os.path.exists(ids):
        subprocess.run([sys.executable, os.path.join(peers, "tokenize.py"), vocab,
                        os.path.join(out, name + ".jsonl"), "--out", ids + ".tmp"],
                       check=True, stdout=subprocess.DEVNULL)
        os.replace(ids + ".tmp", ids)
print(out)
