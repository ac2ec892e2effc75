#!/usr/bin/python3
"""robustness.py - issue 39's robustness sets, made and (optionally) measured.

Writes into OUTDIR (never committed; e.g. build/robustness/) a base set of
--count dialogues from gen.py (--seed, default 9202: held-out; use 9101 for the
set to tune on) and its variants A-E (variants.py: A facts the heuristic
cannot see, B filler that looks like facts, C both, D more rounds and more
distance, E read-backs and restatements), as base.jsonl, A.jsonl ... E.jsonl,
and prints what each set looks like (questions, turns, bytes, fact distance,
share of turns the heuristic marks).  The sets depend only on --seed, --count
and --max-bytes.  Seeds already used elsewhere: 4, 5, 6 (training, train.sh),
7 (check_gen), 99 (check_export), 1000 (train.sh's held-out set).

With --run it starts its own commitkvd (--backend host, socket and state
directory in a fresh temporary directory, stopped at exit), runs
`commitkv-dialogue --sync --shadow --json` for each set and each policy of
--policies (default fp16,commitkv) with --semantic (default: the runner's own,
entities), plus anything after `--` (passed to commitkv-dialogue as is), keeps
each run's JSON as OUTDIR/runs/SET.POLICY.SEMANTIC.json, and prints a table:
set, policy, questions, recall, the FP16 shadow's recall on the same run,
bytes_ratio_fp16 (primary), total_bytes_ratio_fp16 and recalled_blocks when
the runner reports them (issue 39 adds them), kl_mean and seconds.  --json
prints the rows as one JSON array instead.

  robustness.py OUTDIR [--count 24] [--seed 9202] [--sets base,A,B,C,D,E]
                [--run] [--policies fp16,commitkv] [--semantic entities|none|embed|oracle]
                [--model tools/agentlm/agentlm.bin] [--bin build/bin] [--memory 4G]
                [--json] [-- EXTRA commitkv-dialogue ARGS]
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import gen  # noqa: E402
import variants  # noqa: E402

SETS = ["base", "A", "B", "C", "D", "E"]


def make_sets(outdir, seed, count, max_bytes, names):
    os.makedirs(outdir, exist_ok=True)
    base = list(gen.generate(seed, count))
    paths, described = {}, {}
    for name in names:
        if name == "base":
            ds = base
        else:
            ds = [variants.transform(d, name, max_bytes) for d in base]
        paths[name] = os.path.join(outdir, name + ".jsonl")
        with open(paths[name], "w") as f:
            for d in ds:
                f.write(json.dumps(d) + "\n")
        described[name] = variants.describe(ds)
    return paths, described


class Daemon:
    """A private commitkvd on a temporary socket, stopped at exit."""

    def __init__(self, bindir, memory):
        self.tmp = tempfile.mkdtemp(prefix="ckv-robust-")
        os.chmod(self.tmp, 0o700)
        self.socket = "ipc://%s/sock" % self.tmp
        state = os.path.join(self.tmp, "state")
        os.mkdir(state, 0o700)
        self.log = open(os.path.join(self.tmp, "commitkvd.log"), "w")
        self.proc = subprocess.Popen([os.path.join(bindir, "commitkvd"), "--backend", "host", "--memory", memory,
                                      "--socket", self.socket, "--state-dir", state],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: sys.exit(130))
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(self.tmp, "sock")):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                sys.exit("robustness: commitkvd did not start (log: %s)" % self.log.name)
            time.sleep(0.1)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def run_one(bindir, model, socket, path, policy, semantic, extra):
    cmd = [os.path.join(bindir, "commitkv-dialogue"), "--model", model, "--dialogues", path, "--policy", policy,
           "--socket", socket, "--sync", "--shadow", "--json", "--quiet"]
    if semantic:
        cmd += ["--semantic", semantic]
    t0 = time.time()
    p = subprocess.run(cmd + extra, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("robustness: %s failed (exit %d):\n%s" % (" ".join(cmd + extra), p.returncode, p.stderr))
    out = json.loads(p.stdout)
    out["wall_seconds"] = round(time.time() - t0, 1)
    return out


OPTIONAL = ("total_bytes_ratio_fp16", "recalled_blocks")


def row(name, policy, r):
    x = {"set": name, "policy": r.get("policy", policy), "semantic": r.get("semantic"),
         "dialogues": r.get("dialogues"), "skipped": r.get("skipped"), "questions": r.get("questions"),
         "recall": r.get("recall"), "shadow_recall": r.get("shadow_recall"),
         "bytes_ratio_fp16": r.get("bytes_ratio_fp16"), "kl_mean": r.get("kl_mean"),
         "seconds": r.get("wall_seconds")}
    for k in OPTIONAL:
        if k in r:
            x[k] = r[k]
    return x


def fmt(v, digits=3):
    if v is None:
        return "-"
    return ("%.*f" % (digits, v)) if isinstance(v, float) else str(v)


def print_table(rows):
    extra = [k for k in OPTIONAL if any(k in r for r in rows)]
    head = ["set", "policy", "semantic", "questions", "recall", "fp16 shadow", "bytes/FP16"] + extra + ["KL", "s"]
    print(" | ".join(head))
    for r in rows:
        cells = [r["set"], r["policy"], r["semantic"] or "-", fmt(r["questions"]), fmt(r["recall"]),
                 fmt(r["shadow_recall"]), fmt(r["bytes_ratio_fp16"])] + [fmt(r.get(k)) for k in extra] + \
                [fmt(r["kl_mean"], 4), fmt(r["seconds"], 0)]
        print(" | ".join(cells))


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--seed", type=int, default=9202, help="gen.py seed (9202 held-out, 9101 tune)")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--max-bytes", type=int, default=1024, help="variants' bound, BOS included (the model's window)")
    ap.add_argument("--run", action="store_true", help="measure through a private commitkvd")
    ap.add_argument("--policies", default="fp16,commitkv")
    ap.add_argument("--semantic", default=None, help="commitkv-dialogue --semantic (default: the runner's, entities)")
    ap.add_argument("--model", default=os.path.join(HERE, "agentlm.bin"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--memory", default="4G")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    names = [s for s in a.sets.split(",") if s]
    bad = [s for s in names if s not in SETS]
    if bad:
        ap.error("unknown sets %s (known: %s)" % (bad, ",".join(SETS)))
    paths, described = make_sets(a.outdir, a.seed, a.count, a.max_bytes, names)
    if a.json and not a.run:
        print(json.dumps({name: dict(described[name], path=paths[name]) for name in names}))
        return 0
    for name in names:
        print("%-4s %s  %s" % (name, json.dumps(described[name]), paths[name]), file=sys.stderr if a.json else sys.stdout)
    if not a.run:
        return 0
    d = Daemon(a.bin, a.memory)
    rows = []
    os.makedirs(os.path.join(a.outdir, "runs"), exist_ok=True)
    for name in names:
        for policy in [p for p in a.policies.split(",") if p]:
            r = run_one(a.bin, a.model, d.socket, paths[name], policy, a.semantic, extra)
            with open(os.path.join(a.outdir, "runs", "%s.%s.%s.json" % (name, policy, r.get("semantic"))), "w") as f:
                json.dump(r, f)
            rows.append(row(name, policy, r))
            if not a.json:
                print("ran %s %s: recall %s, bytes/FP16 %s, %.0f s" % (name, policy, fmt(r["recall"]),
                      fmt(r["bytes_ratio_fp16"]), r["wall_seconds"]), file=sys.stderr)
    d.stop()
    if a.json:
        print(json.dumps(rows))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
