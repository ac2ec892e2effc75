#!/usr/bin/python3
"""check_variants.py - variants.py keeps the task's rules (standard library only).

Generates --count dialogues with gen.py (--seed), runs variants.py on them for
each of A-E twice, and checks:
  - the same input gives the same bytes (determinism);
  - every dialogue keeps the schema, fits --max-bytes and every recall entry
    is a user question answered by exactly its answer, a sentence of the live
    task's confirmation (check_gen.check_sample);
  - A (and C): no asked value (the answer after its sentence form) holds a
    digit or a capital letter, no answer and no task turn names an entity in
    the sense of the worker's heuristic (variants.entity_words, the rule of
    examples/llm/dialogues.c), and every answer appears verbatim in the
    confirming turn before its question;
  - B (and C): the answers are the base set's (A's for C), and chit-chat now
    names entities;
  - D: more turns and a longer median fact distance than the base set;
  - E: a read-back turn follows confirmations and no read-back is asked.
Prints "check_variants: ok: ..." and exits 0, or each violation and exits 1.

  check_variants.py [--count 60] [--seed 7] [--max-bytes 1024]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check_gen import check_sample  # noqa: E402
from gen import KINDS, fact_kind  # noqa: E402
import variants  # noqa: E402


def run_variant(variant, base, max_bytes):
    cmd = [sys.executable, os.path.join(HERE, "variants.py"), "--variant", variant, "--max-bytes", str(max_bytes)]
    return subprocess.run(cmd, input=base, check=True, capture_output=True).stdout


def value_of(answer):
    prefix = [p for p, k in KINDS if k == fact_kind(answer)]
    return answer[len(prefix[0]):] if prefix else answer


def check_hidden(d, task_turns):
    """A's promise: the heuristic sees none of the asked values.  task_turns:
    check every task turn (A); otherwise (C, whose filler names entities on
    purpose) every turn that holds an asked value."""
    errs = []
    turns = d["turns"]
    values = set()
    for r in d["recall"]:
        v = value_of(r["answer"]).rstrip(".")
        values.add(v)
        if any(c.isdigit() or c.isupper() for c in v):
            errs.append("%s: asked value %r has a digit or capital" % (d["id"], v))
        if variants.entity_words(r["answer"]):
            errs.append("%s: answer %r names an entity" % (d["id"], r["answer"]))
        if not any(t["text"].startswith("Confirmed. ") and (" " + r["answer"]) in t["text"]
                   for t in turns[:r["question_turn"]]):
            errs.append("%s: answer %r in no confirmation before it" % (d["id"], r["answer"]))
    if task_turns:
        check = [t for b in variants.to_blocks(d) if b.kind in ("task", "qa") for _, t in b.turns]
    else:
        check = [t["text"] for t in turns if any(v in t["text"] for v in values)]
    for t in check:
        if variants.entity_words(t):
            errs.append("%s: turn %r names %s" % (d["id"], t, variants.entity_words(t)))
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-bytes", type=int, default=1024)
    a = ap.parse_args()
    base_bytes = subprocess.run([sys.executable, os.path.join(HERE, "gen.py"), "--seed", str(a.seed), "--count",
                                 str(a.count)], check=True, capture_output=True).stdout
    sets = {"base": [json.loads(x) for x in base_bytes.splitlines()]}
    errs = []
    for v in "ABCDE":
        first = run_variant(v, base_bytes, a.max_bytes)
        if run_variant(v, base_bytes, a.max_bytes) != first:
            errs.append("%s: two runs on the same input differ" % v)
        sets[v] = [json.loads(x) for x in first.splitlines()]
        if len(sets[v]) != a.count:
            errs.append("%s: %d dialogues out of %d" % (v, len(sets[v]), a.count))
        for d in sets[v]:
            errs += check_sample(d, a.max_bytes)
    for v in "AC":
        for d in sets[v]:
            errs += check_hidden(d, v == "A")
    for v, src in (("B", "base"), ("C", "A")):
        for d, s in zip(sets[v], sets[src]):
            if [r["answer"] for r in d["recall"]] != [r["answer"] for r in s["recall"]]:
                errs.append("%s %s: answers differ from %s's" % (v, d["id"], src))
    stats = {k: variants.describe(s) for k, s in sets.items()}
    if stats["B"]["entity_turns"] <= stats["base"]["entity_turns"]:
        errs.append("B: no more entity turns than the base set: %s" % stats["B"])
    if stats["D"]["turns_mean"] <= stats["base"]["turns_mean"] or \
            stats["D"]["distance_median"] <= stats["base"]["distance_median"]:
        errs.append("D: not longer in rounds and distance: %s vs %s" % (stats["D"], stats["base"]))
    readbacks = 0
    for d in sets["E"]:
        asked = {r["question_turn"] for r in d["recall"]}
        for i, t in enumerate(d["turns"]):
            if t["text"].startswith("Just to check: "):
                readbacks += 1
                if i in asked or not d["turns"][i - 1]["text"].startswith("Confirmed. "):
                    errs.append("E %s turn %d: a read-back asked or not after a confirmation" % (d["id"], i))
    if not readbacks:
        errs.append("E: no read-back")
    for e in errs:
        print(e)
    if errs:
        print("check_variants: %d violations" % len(errs))
        return 1
    print("check_variants: ok: %d dialogues x A-E, seed %d, %d read-backs" % (a.count, a.seed, readbacks))
    for k, s in stats.items():
        print("  %-4s %s" % (k, json.dumps(s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
