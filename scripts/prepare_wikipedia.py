#!/usr/bin/python3
"""Prepare the Wikipedia paragraph corpus for the LDA experiments (issue 15).

  scripts/prepare_wikipedia.py [--example] [DATA_DIR] [OUT_DIR]

DATA_DIR defaults to ../shared/data/wikipedia_paragraphs, OUT_DIR to
out/wikipedia, which is where config/examples/lda_wikipedia.yaml reads its
vocabulary (out/wikipedia/vocab.txt) and training file
(out/wikipedia/train.jsonl). The corpus's licence forbids shipping it, so
the example's inputs come from here. --example writes only what the example
needs (train.jsonl, validation.jsonl, test.jsonl, vocab.txt), without the
peer kit's tokeniser or scikit-learn. Writes into OUT_DIR (out/ is ignored
by git; never into the tracked tree):
  train.jsonl        the training file minus the validation articles
  validation.jsonl   every paragraph of 5 % of the training articles, chosen by
                     a hash of the article id (a split by article, as the
                     corpus's own train/test split), for choosing settings
  test.jsonl         a copy of the corpus's test file, used only for the final
                     figures
  *_ids.jsonl        the same files tokenised with the peer kit's tokenizer
  vocab.txt          the corpus vocabulary (10,000 terms)
  vocab50k.txt       50,000 terms by the corpus's own vocabulary rule, from
                     train.jsonl, with train_ids50k.jsonl: the K x V = 100 x
                     50,000 step benchmark (scripts/bench_lda_scale.sh)
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
args = sys.argv[1:]
example_only = "--example" in args
args = [a for a in args if a != "--example"]
if len(args) > 2 or any(a.startswith("-") for a in args):
    sys.exit("usage: scripts/prepare_wikipedia.py [--example] [DATA_DIR] [OUT_DIR]")
example_out = os.path.realpath(os.path.join(here, "..", "out", "wikipedia"))
data = os.path.realpath(args[0] if len(args) > 0 else
                        os.path.join(here, "..", "..", "shared", "data", "wikipedia_paragraphs"))
out = os.path.realpath(args[1] if len(args) > 1 else example_out)
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
    shutil.copy(os.path.join(data, "vocab_train_top10000.txt"), vocab + ".tmp")
    os.replace(vocab + ".tmp", vocab)
if out == example_out:
    print("config/examples/lda_wikipedia.yaml reads %s and %s" %
          (os.path.relpath(vocab, os.path.join(here, "..")),
           os.path.relpath(os.path.join(out, "train.jsonl"), os.path.join(here, ".."))))
else:
    print("note: config/examples/lda_wikipedia.yaml reads out/wikipedia/, not %s" % out)
if example_only:
    sys.exit(0)


def tokenize(vocabulary, name, ids):
    """OUT/name.jsonl -> OUT/ids with the peer kit's tokenizer (skipped if done)."""
    ids = os.path.join(out, ids)
    if not os.path.exists(ids):
        subprocess.run([sys.executable, os.path.join(peers, "tokenize.py"), vocabulary,
                        os.path.join(out, name + ".jsonl"), "--out", ids + ".tmp"],
                       check=True, stdout=subprocess.DEVNULL)
        os.replace(ids + ".tmp", ids)


for name in ("train", "validation", "test"):
    tokenize(vocab, name, name + "_ids.jsonl")

# The corpus's vocabulary rule (stats.json "vocab_rule") with 50,000 terms:
# alphabetic, 3..20 letters, lowercase, not a scikit-learn stop word,
# 5 <= document frequency <= half the documents, top by document frequency,
# ties alphabetical. Counted on train.jsonl (validation and test unseen).
vocab50k = os.path.join(out, "vocab50k.txt")
if not os.path.exists(vocab50k):
    import collections
    import re
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
    word = re.compile(r"(?u)\b\w\w+\b")
    alphabetic = re.compile(r"[a-z]{3,20}")
    df, docs = collections.Counter(), 0
    with open(os.path.join(out, "train.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                docs += 1
                df.update(set(word.findall(json.loads(line)["text"].lower())))
    terms = [t for t, n in df.items() if alphabetic.fullmatch(t) and t not in ENGLISH_STOP_WORDS
             and 5 <= n <= docs / 2]
    terms.sort(key=lambda t: (-df[t], t))
    with open(vocab50k + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in terms[:50000]))
    os.replace(vocab50k + ".tmp", vocab50k)
tokenize(vocab50k, "train", "train_ids50k.jsonl")
print(out)
