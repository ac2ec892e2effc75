#!/usr/bin/python3
"""check_gen.py - gen.py's output keeps the task's rules (standard library only).

Runs gen.py twice with one seed and once with another, then checks every
sample: the schema of the public file ({"id", "turns": [{"role", "text"}],
"recall": [{"turn", "question_turn", "answer"}]}, roles S/U/A/T, a system turn
first); BOS plus the rendering fits --max-bytes; each recall entry is a user
question followed by an assistant turn that says exactly its answer, and that
answer is a sentence of the newest confirming turn stating that kind of fact,
with no topic shift between them (the task is live, the answer unique); the
same seed gives the same bytes, another seed others; and, with --public FILE,
no public dialogue, confirming turn or tool turn appears in the output.
Prints "check_gen: ok: ..." and exits 0, or prints each violation and exits 1.

  check_gen.py [--count 200] [--seed 7] [--public ../shared/models/agent-dialogues.jsonl]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen import KINDS, fact_kind  # noqa: E402


def run_gen(seed, count, extra):
    cmd = [sys.executable, os.path.join(HERE, "gen.py"), "--seed", str(seed), "--count", str(count)] + extra
    return subprocess.run(cmd, check=True, capture_output=True).stdout


def render(d):
    return "".join("%s: %s\n" % (t["role"], t["text"]) for t in d["turns"]).encode()


def check_sample(d, max_bytes):
    errs = []
    if set(d) - {"aux"} != {"id", "turns", "recall"} or not isinstance(d["turns"], list):
        return ["%s: keys %s" % (d.get("id"), sorted(d))]
    ident = d["id"]
    turns = d["turns"]
    for i, t in enumerate(turns):
        if set(t) != {"role", "text"} or t["role"] not in ("S", "U", "A", "T") or "\n" in t["text"]:
            errs.append("%s turn %d: bad turn %r" % (ident, i, t))
    if not turns or turns[0]["role"] != "S":
        errs.append("%s: no system turn first" % ident)
    size = 1 + len(render(d))
    if size > max_bytes:
        errs.append("%s: %d bytes with BOS > %d" % (ident, size, max_bytes))
    for r in d["recall"]:
        if set(r) != {"turn", "question_turn", "answer"}:
            errs.append("%s: recall keys %s" % (ident, sorted(r)))
            continue
        q, a = r["question_turn"], r["turn"]
        if a != q + 1 or a >= len(turns) or turns[q]["role"] != "U" or turns[a]["role"] != "A" \
                or turns[a]["text"] != r["answer"]:
            errs.append("%s: recall %r does not match its turns" % (ident, r))
            continue
        if d.get("aux"):
            continue
        kind = fact_kind(r["answer"])
        prefix = [p for p, k in KINDS if k == kind]
        if not prefix:
            errs.append("%s turn %d: answer %r of no fact kind" % (ident, a, r["answer"]))
            continue
        # newest confirming turn with a sentence of this kind, before the question
        src = None
        for i in range(q - 1, -1, -1):
            t = turns[i]
            if t["role"] == "U" and (t["text"].startswith("Forget") or t["text"].startswith("Never mind")):
                break  # a shift: the tasks before it are not live
            if t["role"] == "A" and t["text"].startswith("Confirmed. ") and prefix[0] in t["text"]:
                src = t["text"]
                break
        if src is None:
            errs.append("%s turn %d: %r asked with no live task stating it" % (ident, a, r["answer"]))
        elif (" " + r["answer"]) not in src:
            errs.append("%s turn %d: %r is not what the live task confirmed (%r)" % (ident, a, r["answer"], src))
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-bytes", type=int, default=1000)
    ap.add_argument("--public", help="the public evaluation jsonl, to check none of it is produced")
    a = ap.parse_args()
    extra = ["--copy-short", "5", "--copy-long", "5", "--max-bytes", str(a.max_bytes)]
    out = run_gen(a.seed, a.count, extra)
    errs = []
    if run_gen(a.seed, a.count, extra) != out:
        errs.append("the same seed gave different output")
    if run_gen(a.seed + 1, a.count, extra) == out:
        errs.append("another seed gave the same output")
    ds = [json.loads(line) for line in out.decode().splitlines()]
    if len(ds) != a.count + 10:
        errs.append("%d samples, expected %d" % (len(ds), a.count + 10))
    n_recall = 0
    for d in ds:
        errs += check_sample(d, a.max_bytes)
        n_recall += len(d["recall"]) if not d.get("aux") else 0
    if n_recall < a.count:
        errs.append("only %d questions in %d dialogues" % (n_recall, a.count))
    n_public = 0
    if a.public:
        gen_dialogues = {render(d) for d in ds}
        gen_turns = {t["text"] for d in ds for t in d["turns"] if t["role"] in ("A", "T")}
        for line in open(a.public):
            p = json.loads(line)
            n_public += 1
            if render(p) in gen_dialogues:
                errs.append("public dialogue %s produced" % p["id"])
            for t in p["turns"]:
                if (t["role"] == "T" or t["text"].startswith("Confirmed. ")) and t["text"] in gen_turns:
                    errs.append("public turn of %s produced: %r" % (p["id"], t["text"]))
    for e in errs:
        print("check_gen: " + e)
    if errs:
        return 1
    print("check_gen: ok: %d samples, %d questions, max %d bytes, %d public dialogues disjoint"
          % (len(ds), n_recall, max(1 + len(render(d)) for d in ds), n_public))
    return 0


if __name__ == "__main__":
    sys.exit(main())
