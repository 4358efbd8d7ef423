#!/usr/bin/env python3
"""Generates the bundled demo corpus: synthetic documents drawn from known topics.

    scripts/make_demo_corpus.py OUT_DIR

Writes OUT_DIR/vocab.txt (the public vocabulary), OUT_DIR/corpus.jsonl (the
documents the embedded demo feeds into its input topic),
OUT_DIR/topics.txt (the generating topics, for comparison with what vipsd
learns) and OUT_DIR/public.jsonl (300 further documents of the same kind
from another seed: the "public corpus" config/examples/lda_public_fit.yaml
fits the public prior of config/examples/lda_public_prior.yaml on). Deterministic (fixed seed), standard library only. Everything is
synthetic: the words are ordinary English words grouped by theme by hand, the
documents are draws from the LDA generative process, so the corpus is free to
redistribute.
"""
import json
import random
import sys

THEMES = {
    "space": "orbit rocket planet moon launch satellite astronaut telescope galaxy comet "
             "asteroid gravity mission shuttle lunar solar crater capsule nebula cosmos",
    "cooking": "recipe oven flour butter garlic onion simmer bake pepper sauce dough salt "
               "kitchen roast spoon onions olive vinegar pastry broth",
    "football": "goal striker match league referee penalty keeper midfield stadium coach "
                "tackle season defender kickoff fans derby pitch corner header trophy",
    "medicine": "patient doctor clinic vaccine symptom therapy nurse dose hospital diagnosis "
                "surgery fever infection blood treatment pharmacy chronic virus antibody ward",
    "finance": "market stock bond interest inflation bank loan investor dividend equity "
               "currency budget profit revenue shares credit mortgage fund trading debt",
    "music": "guitar melody chorus album concert drummer piano rhythm song band lyrics tempo "
             "violin orchestra singer chord studio jazz bass festival",
    "weather": "rain storm cloud wind forecast thunder snow humidity temperature drought "
               "flood sunshine breeze frost hail fog monsoon climate lightning degrees",
    "software": "compiler server database kernel bug release code thread memory network "
                "library debug deploy module cache query function script cluster backend",
}
FILLER = ("people time year work day week place group report world number part city "
          "story result change point family history public team order level").split()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    rng = random.Random(20261123)
    topics = {name: words.split() for name, words in THEMES.items()}
    vocab = sorted({w for ws in topics.values() for w in ws} | set(FILLER))
    names = list(topics)
    with open(f"{out}/vocab.txt", "w") as f:
        f.write("".join(w + "\n" for w in vocab))
    with open(f"{out}/topics.txt", "w") as f:
        for name in names:
            f.write(f"{name}: {' '.join(topics[name][:10])}\n")
    def document(rng):
        # θ ~ Dirichlet(0.1): most documents are about one or two themes.
        weights = [rng.gammavariate(0.1, 1.0) for _ in names]
        total = sum(weights)
        length = rng.randint(40, 90)
        words = []
        for _ in range(length):
            if rng.random() < 0.15:
                words.append(rng.choice(FILLER))
                continue
            r, acc = rng.random() * total, 0.0
            for name, w in zip(names, weights):
                acc += w
                if r <= acc:
                    break
            # Zipf-like word choice inside a theme.
            ws = topics[name]
            idx = min(int(rng.paretovariate(2.0)) - 1, len(ws) - 1) if rng.random() < 0.3 else rng.randrange(len(ws))
            words.append(ws[idx])
        return " ".join(words)

    with open(f"{out}/corpus.jsonl", "w") as f:
        for d in range(5000):
            text = document(rng)
            f.write(json.dumps({"id": f"demo-{d}", "text": text.capitalize() + "."}) + "\n")
        # A few malformed records: the demo shows them going to the dead-letter topic.
        f.write('{"id": "demo-bad-1", "text": 42}\n')
        f.write('not json at all\n')
        f.write('{"id": "demo-bad-3", "text": "zebra quagga okapi"}\n')
        f.write('{"text": "missing id"}\n')
    public_rng = random.Random(20261205)
    with open(f"{out}/public.jsonl", "w") as f:
        for d in range(300):
            text = document(public_rng)
            f.write(json.dumps({"id": f"public-{d}", "text": text.capitalize() + "."}) + "\n")


if __name__ == "__main__":
    main()
