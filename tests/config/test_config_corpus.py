"""Real DeepSpeed configs (tests/config/real, sources in its README) run as a new user runs them:
`zo-train --config FILE --steps 1 --seq 32 --micro-batch 2`. Each must do what real/expected.txt
says: train one step (exit 0, one finite loss), or be refused before anything runs (exit 2) as not
supported by zoffload, naming the key (and the optimizer or scheduler type) it lacks, or ("ranks N",
a tensor_parallel.autotp_size N config) be refused on one process (exit 2) saying to launch N ranks. A config
added to the folder without a line there fails the test, so every new one is classified.
Prints the table of outcomes. Run by ctest: test_config_corpus.py ZO_TRAIN CORPUS_DIR."""
import json
import math
import os
import subprocess
import sys
import tempfile

FLAGS = ["--steps", "1", "--seq", "32", "--micro-batch", "2", "--device", "cpu",
         "--val-batches", "1", "--json"]


def expectations(corpus):
    want = {}
    with open(os.path.join(corpus, "expected.txt"), encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, outcome = line.split(None, 1)
                want[name] = outcome.strip()
    return want


def run(exe, path, swap):
    p = subprocess.run([exe, "--config", path, "--nvme-path", swap] + FLAGS,
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def check_trains(rc, out, err):
    if rc != 0:
        return f"exit {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    losses = json.loads(out)["losses"]
    if len(losses) != 1 or not math.isfinite(losses[0]):
        return f"losses {losses}"
    return None


def check_refused(rc, err, outcome):
    key, _, value = outcome.split(None, 1)[1].partition("=")
    named = f"'{key}'" in err and (not value or f'"{value}"' in err)
    if rc != 2 or "not supported by zoffload" not in err or not named:
        return f"exit {rc}, expected 2 naming '{key}' {value}: {err.strip()[-300:]}"
    return None


def check_ranks(rc, err, outcome):
    n = outcome.split()[1]
    if rc != 2 or "tensor_parallel.autotp_size" not in err or f"mpirun -np {n}" not in err:
        return f"exit {rc}, expected 2 asking for mpirun -np {n}: {err.strip()[-300:]}"
    return None


def main():
    exe, corpus = sys.argv[1], sys.argv[2]
    want = expectations(corpus)
    files = sorted(f for f in os.listdir(corpus) if f.endswith(".json"))
    failures = [f"{f}: not in expected.txt (add `{f} trains` or `unsupported KEY`)"
                for f in files if f not in want]
    failures += [f"{f}: listed in expected.txt but missing" for f in want if f not in files]
    counts = {}
    with tempfile.TemporaryDirectory(prefix="zo-corpus-") as swap:
        for f in files:
            if f not in want:
                continue
            rc, out, err = run(exe, os.path.join(corpus, f), swap)
            outcome = want[f]
            bad = (check_trains(rc, out, err) if outcome == "trains"
                   else check_ranks(rc, err, outcome) if outcome.startswith("ranks ")
                   else check_refused(rc, err, outcome))
            kind = outcome.split()[0]
            counts[kind if not bad else "wrong"] = counts.get(kind if not bad else "wrong", 0) + 1
            print(f"{f:48s} {outcome:40s} {'ok' if not bad else 'WRONG: ' + bad}")
            if bad:
                failures.append(f"{f}: {bad}")
    print(f"\n{len(files)} configs: {counts.get('trains', 0)} train, "
          f"{counts.get('unsupported', 0)} refused as not supported, "
          f"{counts.get('ranks', 0)} asking for their tensor-parallel ranks, "
          f"{counts.get('wrong', 0)} wrong")
    for msg in failures:
        print("FAIL", msg, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
