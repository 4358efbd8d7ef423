#!/usr/bin/python3
"""LDA's stated noise and the public prior on Wikipedia (docs/results.md §6, §7).

  bench/lda_noise_aware.py [--build build] [--data out/results/wikipedia]
                           [--out out/lda-noise] [--parts noise,public,...]

Every run is bench/lda_svi_run with the settings of docs/results.md §1 (K =
50, α = η = 0.02, N = 500, a = 0.1, q = 1, T = 15, τ0 = 1, κ = 0.7, δ = 1e-5;
σ for ε = 1 / 2 / 4 from that section), and every run draws its own noise
(OS-seeded). Runs are cached as OUT/NAME.json (delete one to re-run it).

  noise   two runs at ε = 2 with the same --seed (the same start), differing
          only in their noise, compared by bench/lda_noise_calibration.py:
          the spread the release states against the spread measured.
  public  the public prior (docs/models.md, "Public priors"): the public
          slice of bench/public_slice.py (about 2 % of the training articles,
          by a hash of the article id; the private runs train on the rest) is
          fitted non-privately (η = 0.5, minibatch 256, 20 passes, τ0 = 64:
          chosen on the validation file) and scored alone (the public-only
          line); then private runs start from it, on the validation file at
          ε = 2 and on the test file at each ε.
  people  how many people a useful model needs (issue 48): docs/results.md
          §4's article-level settings at ε = 4 (K = 10, α = 0.1, cap 64,
          σ = 4.19), trained on the first 2,000 / 5,000 / 10,000 / all of
          the private articles (ranked by sha256("people:" + article), so
          the sets are nested), from a random start and from a public fit
          of the public slice at K = 10 (the public part's fit settings);
          test file. Writes OUT/people.png when matplotlib is there.
  public_steps  fewer private steps at the same ε from the public start
          (T = 3, 5, 8 with their σ; τ0 = 1 and 16), validation file, ε = 2.
  seeds   the public-start lines again with --seed 2 and 3: record level
          at ε = 1 and 2, and the people part's run on every private
          article (τ0 = 256). A public start does not depend on the seed,
          so these runs differ in their noise.
  ood     the out-of-domain public start: the training files of 20
          Newsgroups, Reuters-21578 and AG News (../shared/data, 31,728
          documents) tokenised into the Wikipedia vocabulary, fitted with
          the public part's settings, scored alone, and used as the start
          of record-level private runs on the whole training file at ε =
          1, 2 and 4, each beside a random start with the same seed.
  blend   the shipped public start (model.public_prior.weight, core/models/
          lda.h): λ₀ = (1 − m)·random start + m·public topics at the random
          start's mass. The parts above start from the public λ as it is
          (--lambda-in: the full start that came first); this part from the
          blend (--public-lambda, --public-weight). m chosen on the
          validation file at ε = 2 (m = 0.5 ... 0.005), and between 0.01
          and 0.02 also at ε = 1 and 4; then, at --weight (default 0.01,
          the shipped default), three runs (--seed 1, 2, 3) of the
          record-level lines at ε = 1 and 2 (one at ε = 4; at ε = 1 also
          with m = 0.02, the validation file's choice there) and of the article-level
          line (all private articles, K = 10, ε = 4; τ0 chosen on the
          validation file between 1 and 256), the out-of-domain news start
          at ε = 1, 2, 4 (beside the ood part's random starts), and the
          people part's smaller sets.

Prints JSON. Needs Debian's python3 with numpy and scipy. Wall time on 2
cores: about 4.5 minutes per record-level private run and 2 per
article-level run on every article (the blend part: 23 runs not cached).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.realpath(os.path.join(HERE, ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "out", "results", "wikipedia"))
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "lda-noise"))
    ap.add_argument("--parts", default="noise,public",
                    help="comma-separated: noise, public, public_steps, seeds, people_tau, "
                         "people, ood, blend")
    ap.add_argument("--weight", default="0.01",
                    help="blend: model.public_prior.weight of the test-file runs")
    ap.add_argument("--tau0-public", default="1",
                    help="people: τ0 of the public-start runs (chosen by --parts people_tau)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    binary = os.path.join(args.build, "bench", "lda_svi_run")
    train, val, test = (os.path.join(args.data, n + "_ids.jsonl")
                        for n in ("train", "validation", "test"))
    for path in (binary, train, val, test):
        if not os.path.exists(path):
            sys.exit(f"lda_noise_aware: {path} is missing (build bench/lda_svi_run; "
                     "scripts/prepare_wikipedia.py prepares the corpus)")
    common = ["--V", "10000", "--K", "50", "--alpha", "0.02", "--eta", "0.02", "--N", "500",
              "--clip", "0.1", "--threads", "2", "--delta", "1e-05", "--q", "1.0",
              "--steps", "15", "--tau0", "1", "--epsilon", "100"]
    report = {}

    def run(name, extra):
        path = os.path.join(args.out, name + ".json")
        if not os.path.exists(path):
            command = [binary] + extra
            print("run:", " ".join(command), file=sys.stderr)
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            with open(path, "w") as f:
                f.write(out)
        with open(path) as f:
            return json.load(f)["doc_completion_perplexity"]

    if "noise" in args.parts.split(","):
        runs = []
        for name in ("noise_eps2_a", "noise_eps2_b"):
            lam = os.path.join(args.out, name + ".bin")
            report[name] = run(name, ["--train", train, "--test", test, "--sigma", "7.73",
                                      "--seed", "1", "--lambda-out", lam] + common)
            runs.append(lam)
        report["calibration"] = json.loads(subprocess.run(
            [sys.executable, os.path.join(HERE, "lda_noise_calibration.py")] + runs +
            ["--K", "50", "--V", "10000", "--eta", "0.02"],
            check=True, capture_output=True, text=True).stdout)

    def public_fit():
        public_dir = os.path.join(args.out, "public")
        report["slice"] = json.loads(subprocess.run(
            [sys.executable, os.path.join(HERE, "public_slice.py"), train, public_dir],
            check=True, capture_output=True, text=True).stdout)
        public_lambda = os.path.join(public_dir, "public_lambda.bin")
        fit = ["--train", os.path.join(public_dir, "public_ids.jsonl"), "--test", val,
               "--V", "10000", "--K", "50", "--alpha", "0.02", "--eta", "0.5", "--threads", "1",
               "--batch", "256", "--passes", "20", "--tau0", "64", "--lambda-out", public_lambda]
        if not os.path.exists(public_lambda) and os.path.exists(
                os.path.join(args.out, "public_fit.json")):
            os.remove(os.path.join(args.out, "public_fit.json"))
        report["public_fit_validation"] = run("public_fit", fit)
        return public_dir, public_lambda

    if "public" in args.parts.split(","):
        public_dir, public_lambda = public_fit()
        public_ids = os.path.join(public_dir, "public_ids.jsonl")
        private_ids = os.path.join(public_dir, "private_ids.jsonl")
        report["public_only_test"] = run(
            "public_only_test", ["--train", public_ids, "--test", test, "--V", "10000", "--K", "50",
                                 "--alpha", "0.02", "--eta", "0.02", "--threads", "2",
                                 "--batch", "256", "--steps", "0", "--lambda-in", public_lambda])
        start = ["--train", private_ids, "--lambda-in", public_lambda, "--seed", "1"]
        report["public_start_validation_eps2"] = run(
            "public_val_eps2", start + ["--test", val, "--sigma", "7.73"] + common)
        for eps, sigma in (("1", 14.5), ("2", 7.73), ("4", 4.19)):
            report[f"public_start_test_eps{eps}"] = run(
                f"public_test_eps{eps}", start + ["--test", test, "--sigma", str(sigma)] + common)
    if "public_steps" in args.parts.split(","):
        # With a public start the private steps need not find the topics
        # from nothing: fewer steps at the same ε, each with less noise
        # (σ from `vipsd-privacy sigma --target-epsilon 2 --sampling-rate 1
        # --delta 1e-5 --steps T`), and τ0. Validation file, ε = 2.
        public_dir, public_lambda = public_fit()
        start = ["--train", os.path.join(public_dir, "private_ids.jsonl"), "--lambda-in",
                 public_lambda, "--seed", "1", "--test", val]
        for steps, sigma, tau0 in (("3", "3.46", "1"), ("5", "4.46", "1"), ("8", "5.64", "1"),
                                   ("5", "4.46", "16"), ("3", "3.46", "16")):
            name = f"public_val_eps2_T{steps}_tau{tau0}"
            schedule = common[:common.index("--steps")] + ["--steps", steps, "--tau0", tau0,
                                                           "--epsilon", "100"]
            report[name] = run(name, start + ["--sigma", sigma] + schedule)
            print(name, report[name], file=sys.stderr, flush=True)
    if "seeds" in args.parts.split(","):
        # Issue 48's targets ask for 3 seeds: the public-start lines of the
        # public part (--seed 1) and of the people part (all private
        # articles, τ0 = 256, --seed 1) again with --seed 2 and 3 (each run
        # also draws its own noise).
        public_dir, public_lambda = public_fit()
        start = ["--train", os.path.join(public_dir, "private_ids.jsonl"), "--lambda-in",
                 public_lambda, "--test", test]
        unit = ["--V", "10000", "--K", "10", "--alpha", "0.1", "--eta", "0.02", "--N", "500",
                "--clip", "0.1", "--threads", "2", "--delta", "1e-05", "--q", "1.0",
                "--steps", "15", "--tau0", "256", "--epsilon", "100", "--sigma", "4.19",
                "--unit-cap", "64"]
        for seed in ("2", "3"):
            for eps, sigma in (("1", "14.5"), ("2", "7.73")):
                name = f"public_test_eps{eps}_seed{seed}"
                report[name] = run(name, start + ["--seed", seed, "--sigma", sigma] + common)
                print(name, report[name], file=sys.stderr, flush=True)
            name = f"people_23193_public_tau256_seed{seed}"
            report[name] = run(name, [
                "--train", os.path.join(public_dir, "people_23193_ids.jsonl"), "--test", test,
                "--seed", seed, "--lambda-in",
                os.path.join(public_dir, "public_lambda_k10.bin")] + unit)
            print(name, report[name], file=sys.stderr, flush=True)
    if "people_tau" in args.parts.split(","):
        # τ0 of a public start, chosen on the validation file with every
        # private article: a larger τ0 keeps more of the public λ through
        # the noisy steps (ρ_1 = (τ0 + 1)^-0.7).
        public_dir = os.path.join(args.out, "public")
        subset = os.path.join(public_dir, "people_23193_ids.jsonl")
        unit = ["--V", "10000", "--K", "10", "--alpha", "0.1", "--eta", "0.02", "--N", "500",
                "--clip", "0.1", "--threads", "2", "--delta", "1e-05", "--q", "1.0",
                "--steps", "15", "--epsilon", "100", "--sigma", "4.19", "--unit-cap", "64"]
        for tau0 in ("1", "16", "64", "256"):
            report[f"people_val_public_tau{tau0}"] = run(
                f"people_val_public_tau{tau0}",
                ["--train", subset, "--test", val, "--seed", "1", "--tau0", tau0,
                 "--lambda-in", os.path.join(public_dir, "public_lambda_k10.bin")] + unit)
            print("tau0", tau0, report[f"people_val_public_tau{tau0}"], file=sys.stderr,
                  flush=True)
    if "people" in args.parts.split(","):
        people(args, run, report, test, args.tau0_public)
    if "ood" in args.parts.split(","):
        ood_dir = os.path.join(args.out, "ood")
        os.makedirs(ood_dir, exist_ok=True)
        shared = os.path.realpath(os.path.join(ROOT, "..", "shared"))
        public_text = os.path.join(ood_dir, "public.jsonl")
        public_ids = os.path.join(ood_dir, "public_ids.jsonl")
        if not os.path.exists(public_ids):
            with open(public_text, "w") as out:
                for corpus in ("20newsgroups", "reuters21578", "ag_news_test"):
                    with open(os.path.join(shared, "data", corpus, "train.jsonl")) as f:
                        for line in f:
                            doc = json.loads(line)
                            out.write(json.dumps({"id": doc["id"], "text": doc["text"]}) + "\n")
            subprocess.run([sys.executable, os.path.join(shared, "peers", "tokenize.py"),
                            os.path.join(args.data, "vocab.txt"), public_text, "--out",
                            public_ids], check=True, stdout=subprocess.DEVNULL)
        ood_lambda = os.path.join(ood_dir, "ood_lambda.bin")
        report["ood_public_fit_validation"] = run(
            "ood_public_fit", ["--train", public_ids, "--test", val, "--V", "10000", "--K", "50",
                               "--alpha", "0.02", "--eta", "0.5", "--threads", "2",
                               "--batch", "256", "--passes", "20", "--tau0", "64",
                               "--lambda-out", ood_lambda])
        report["ood_public_only_test"] = run(
            "ood_public_only_test", ["--train", public_ids, "--test", test, "--V", "10000",
                                     "--K", "50", "--alpha", "0.02", "--eta", "0.02",
                                     "--threads", "2", "--batch", "256", "--steps", "0",
                                     "--lambda-in", ood_lambda])
        for eps, sigma in (("2", "7.73"), ("1", "14.5"), ("4", "4.19")):
            for name, extra in ((f"ood_random_eps{eps}", []),
                                (f"ood_start_eps{eps}", ["--lambda-in", ood_lambda])):
                report[name] = run(name, ["--train", train, "--test", test, "--sigma", sigma,
                                          "--seed", "1"] + extra + common)
                print(name, report[name], file=sys.stderr, flush=True)
    if "blend" in args.parts.split(","):
        blend(args, run, report, train, val, test, common)
    print(json.dumps(report, indent=1))


UNIGRAM, BEST_NONPRIVATE = 4922.0, 2736.0  # docs/results.md §1, test file


def blend(args, run, report, train, val, test, common):
    public_dir = os.path.join(args.out, "public")
    private_ids = os.path.join(public_dir, "private_ids.jsonl")
    public_lambda = os.path.join(public_dir, "public_lambda.bin")
    ood_lambda = os.path.join(args.out, "ood", "ood_lambda.bin")
    for path in [private_ids, public_lambda, ood_lambda] + [
            os.path.join(public_dir, f"people_{count}_ids.jsonl")
            for count in (2000, 5000, 10000, 23193)]:
        if not os.path.exists(path):
            sys.exit(f"lda_noise_aware: {path} is missing (run --parts public,ood,people first)")
    sigma = {"1": "14.5", "2": "7.73", "4": "4.19"}

    def note(name):
        print(name, report[name], file=sys.stderr, flush=True)

    for m in ("0.5", "0.25", "0.1", "0.05", "0.02", "0.01", "0.005"):
        name = f"blend_val_eps2_m{m}"
        report[name] = run(name, ["--train", private_ids, "--test", val, "--seed", "1",
                                  "--public-lambda", public_lambda, "--public-weight", m,
                                  "--sigma", sigma["2"]] + common)
        note(name)
    for eps in ("1", "4"):
        for m in ("0.01", "0.02"):
            name = f"blend_val_eps{eps}_m{m}"
            report[name] = run(name, ["--train", private_ids, "--test", val, "--seed", "1",
                                      "--public-lambda", public_lambda, "--public-weight", m,
                                      "--sigma", sigma[eps]] + common)
            note(name)
    m = args.weight
    start = ["--public-lambda", public_lambda, "--public-weight", m]
    for seed in ("1", "2", "3"):
        for eps in ("1", "2", "4") if seed == "1" else ("1", "2"):
            name = f"blend_test_eps{eps}_m{m}_seed{seed}"
            report[name] = run(name, ["--train", private_ids, "--test", test, "--seed", seed,
                                      "--sigma", sigma[eps]] + start + common)
            note(name)
    # At ε = 1 the validation file preferred m = 0.02 (by 7): that line too.
    for seed in ("1", "2", "3"):
        name = f"blend_test_eps1_m0.02_seed{seed}"
        report[name] = run(name, ["--train", private_ids, "--test", test, "--seed", seed,
                                  "--sigma", sigma["1"], "--public-lambda", public_lambda,
                                  "--public-weight", "0.02"] + common)
        note(name)
    for eps in ("1", "2", "4"):
        name = f"blend_ood_eps{eps}_m{m}"
        report[name] = run(name, ["--train", train, "--test", test, "--seed", "1",
                                  "--sigma", sigma[eps], "--public-lambda", ood_lambda,
                                  "--public-weight", m] + common)
        note(name)
    # Article level (the people part's settings, every private article).
    unit = ["--V", "10000", "--K", "10", "--alpha", "0.1", "--eta", "0.02", "--N", "500",
            "--clip", "0.1", "--threads", "2", "--delta", "1e-05", "--q", "1.0", "--steps", "15",
            "--epsilon", "100", "--sigma", "4.19", "--unit-cap", "64", "--public-lambda",
            os.path.join(public_dir, "public_lambda_k10.bin"), "--public-weight", m]
    everyone = os.path.join(public_dir, "people_23193_ids.jsonl")
    best_tau0 = None
    for tau0 in ("1", "256"):
        name = f"blend_people_val_m{m}_tau{tau0}"
        report[name] = run(name, ["--train", everyone, "--test", val, "--seed", "1",
                                  "--tau0", tau0] + unit)
        note(name)
        if best_tau0 is None or report[name] < report[f"blend_people_val_m{m}_tau{best_tau0}"]:
            best_tau0 = tau0
    blended = {"tau0": best_tau0}
    for count in ("2000", "5000", "10000", "23193"):
        for seed in ("1", "2", "3") if count == "23193" else ("1",):
            name = f"blend_people_{count}_m{m}_tau{best_tau0}_seed{seed}"
            report[name] = run(name, ["--train", os.path.join(public_dir, f"people_{count}_ids.jsonl"),
                                      "--test", test, "--seed", seed, "--tau0", best_tau0] + unit)
            note(name)
        blended[int(count)] = report[f"blend_people_{count}_m{m}_tau{best_tau0}_seed1"]
    # The people part's table and plot (its runs are cached) with this line.
    people(args, run, report, test, "256", blended)


def share_of_gap(perplexity):
    return (UNIGRAM - perplexity) / (UNIGRAM - BEST_NONPRIVATE)


def people(args, run, report, test, tau0_public="1", blended=None):
    public_dir = os.path.join(args.out, "public")
    train = os.path.join(args.data, "train_ids.jsonl")
    subprocess.run([sys.executable, os.path.join(HERE, "public_slice.py"), train, public_dir],
                   check=True, capture_output=True, text=True)
    public_ids = os.path.join(public_dir, "public_ids.jsonl")
    private_ids = os.path.join(public_dir, "private_ids.jsonl")
    sys.path.insert(0, HERE)
    from public_slice import article
    import hashlib
    by_article = {}
    with open(private_ids) as f:
        for line in f:
            by_article.setdefault(article(json.loads(line)["id"]), []).append(line)
    ranked = sorted(by_article, key=lambda a: hashlib.sha256(("people:" + a).encode()).digest())
    unit = ["--V", "10000", "--K", "10", "--alpha", "0.1", "--eta", "0.02", "--N", "500",
            "--clip", "0.1", "--threads", "2", "--delta", "1e-05", "--q", "1.0", "--steps", "15",
            "--tau0", "1", "--epsilon", "100", "--sigma", "4.19", "--unit-cap", "64"]
    public_lambda = os.path.join(public_dir, "public_lambda_k10.bin")
    run("people_public_fit", ["--train", public_ids, "--test", test, "--V", "10000", "--K", "10",
                              "--alpha", "0.1", "--eta", "0.5", "--threads", "2", "--batch", "256",
                              "--passes", "20", "--tau0", "64", "--lambda-out", public_lambda])
    public_only = run("people_public_only", ["--train", public_ids, "--test", test, "--V", "10000",
                                             "--K", "10", "--alpha", "0.1", "--eta", "0.02",
                                             "--threads", "2", "--batch", "256", "--steps", "0",
                                             "--lambda-in", public_lambda])
    rows = {"public_only": {"perplexity": public_only, "share": share_of_gap(public_only)}}
    for count in (2000, 5000, 10000, len(ranked)):
        subset = os.path.join(public_dir, f"people_{count}_ids.jsonl")
        if not os.path.exists(subset):
            with open(subset, "w") as f:
                for a in ranked[:count]:
                    f.writelines(by_article[a])
        random_start = run(f"people_{count}_random", ["--train", subset, "--test", test,
                                                      "--seed", "1"] + unit)
        suffix = "" if tau0_public == "1" else f"_tau{tau0_public}"
        public_unit = unit[:unit.index("--tau0") + 1] + [tau0_public] + unit[unit.index("--tau0") + 2:]
        public_start = run(f"people_{count}_public{suffix}",
                           ["--train", subset, "--test", test, "--seed", "1", "--lambda-in",
                            public_lambda] + public_unit)
        rows[str(count)] = {"articles": count, "paragraphs": sum(len(by_article[a])
                                                                 for a in ranked[:count]),
                            "random_start": random_start, "public_start": public_start,
                            "random_share": share_of_gap(random_start),
                            "public_share": share_of_gap(public_start)}
        print("people", count, json.dumps(rows[str(count)]), file=sys.stderr, flush=True)
    report["people"] = rows
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    counts = [r["articles"] for k, r in rows.items() if k != "public_only"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(counts, [rows[str(c)]["random_start"] for c in counts], "o-", label="random start")
    ax.plot(counts, [rows[str(c)]["public_start"] for c in counts], "s-",
            label=f"full public start (431 public articles, τ0 = {tau0_public})")
    if blended:
        ax.plot(counts, [blended[c] for c in counts], "^-",
                label=f"blended start (m = {args.weight}, τ0 = {blended['tau0']})")
    ax.axhline(public_only, color="grey", ls="--", label="public only")
    ax.axhline(UNIGRAM, color="black", ls=":", label="unigram")
    ax.axhline(BEST_NONPRIVATE, color="green", ls=":", label="best non-private (all data)")
    ax.set_xscale("log")
    ax.set_xticks(counts)
    ax.set_xticklabels([f"{c:,}" for c in counts])
    ax.minorticks_off()
    ax.set_xlabel("people (articles) in the private training data")
    ax.set_ylabel("test perplexity")
    ax.set_title("Article-level privacy, ε = 4, K = 10")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "people.png"), dpi=110)


if __name__ == "__main__":
    main()
