#!/usr/bin/python3
"""eval.py - recall of the agent LM by exact match, per fact kind and per distance.

For every recall entry of every dialogue in a jsonl file (gen.py's schema, the
public ../shared/models/agent-dialogues.jsonl included): feed BOS and the bytes
up to and including "A: " of the answer turn, decode greedily until a newline,
and compare with answer + "\\n" byte for byte.  Computed in one teacher-forced
forward pass per dialogue: greedy decoding reproduces answer + "\\n" exactly
when, at each of its positions, the argmax given the right bytes before it is
the right byte (decoding stops at the first newline, and the answer holds
none), so the count is the same as decoding's.  --show N decodes the first N
misses for real and prints what the model said.

Distance is in bytes, from where the fact was stated (its sentence in the
confirming turn) to the start of the answer.  The dialogue is cut after its
last answer, and must then fit in the model's seq_len.

This runs the PyTorch forward pass (FP32) over model.bin as exported, or with
--c-bin the project's C forward pass (examples/llm/model.c through
ckv-agentlm-logits, FP32, its own cache; misses shown with --show are still
decoded in PyTorch).  The issue's measurement goes through commitkvd (the C
forward pass with policy fp16): commitkv-dialogue does it (README.md).

  eval.py --model build/agentlm/model.bin --data ../shared/models/agent-dialogues.jsonl [--limit N] [--json]
"""
import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import fact_offset, load_jsonl, render_spans  # noqa: E402
from gen import fact_kind  # noqa: E402
from model import BOS, load_bin  # noqa: E402

BUCKETS = [(0, 128), (128, 256), (256, 512), (512, 1 << 30)]


def bucket(dist):
    for lo, hi in BUCKETS:
        if lo <= dist < hi:
            return "%d-%d" % (lo, hi - 1) if hi < 1 << 30 else "%d+" % lo
    return "?"


def greedy(m, prefix, limit=120):
    ids = list(prefix)
    out = bytearray()
    with torch.no_grad():
        for _ in range(limit):
            if len(ids) >= m.c.seq_len:
                break
            t = int(m(torch.tensor([ids]))[0, -1].argmax())
            if t == BOS:
                break
            out.append(t)
            ids.append(t)
            if t == 10:
                break
    return bytes(out)


def c_argmax(c_bin, model_path, ids):
    """Argmax per position from the project's C forward pass (ckv-agentlm-logits)."""
    import subprocess
    import tempfile
    import numpy as np
    with tempfile.TemporaryDirectory() as td:
        pf, of = os.path.join(td, "prompt"), os.path.join(td, "logits")
        open(pf, "wb").write(bytes(ids[1:]))  # the tool feeds BOS itself
        subprocess.run([c_bin, model_path, pf, of], check=True, capture_output=True)
        return np.fromfile(of, dtype="<f4").reshape(len(ids), -1).argmax(-1).tolist()


def evaluate(m, dialogues, show=0, log=None, c_bin=None, model_path=None, jobs=1):
    c_preds = {}
    if c_bin:
        # one C process per dialogue, jobs of them at a time
        from concurrent.futures import ThreadPoolExecutor

        def prompt(d):
            body, spans = render_spans(d)
            return ([BOS] + list(body))[:max(e for _, e, _ in spans)] if spans else None
        todo = [(i, prompt(d)) for i, d in enumerate(dialogues)]
        todo = [(i, p) for i, p in todo if p is not None and len(p) <= m.c.seq_len]
        with ThreadPoolExecutor(max(1, jobs)) as ex:
            for i, pred in zip([i for i, _ in todo], ex.map(lambda t: c_argmax(c_bin, model_path, t[1]), todo)):
                c_preds[i] = pred
    per_kind = collections.defaultdict(lambda: [0, 0])
    per_dist = collections.defaultdict(lambda: [0, 0])
    items = []
    shown = 0
    for di, d in enumerate(dialogues):
        body, spans = render_spans(d)
        if not spans:
            continue
        last = max(e for _, e, _ in spans)
        ids = ([BOS] + list(body))[:last]
        if len(ids) > m.c.seq_len:
            raise ValueError("%s: %d tokens up to its last answer, seq_len %d" % (d["id"], len(ids), m.c.seq_len))
        if c_bin:
            pred = c_preds[di]
        else:
            with torch.no_grad():
                pred = m(torch.tensor([ids]))[0].argmax(-1).tolist()
        for s, e, r in spans:
            ok = all(pred[p - 1] == ids[p] for p in range(s, e))
            off = fact_offset(d, r)
            dist = s - off if off is not None else -1
            k, b = fact_kind(r["answer"]), bucket(dist)
            for tab, key in ((per_kind, k), (per_dist, b)):
                tab[key][0] += ok
                tab[key][1] += 1
            item = {"id": d["id"], "turn": r["turn"], "kind": k, "distance": dist, "ok": ok}
            if not ok and shown < show:
                item["said"] = greedy(m, ids[:s]).decode("utf-8", "replace")
                shown += 1
                if log:
                    log("miss %s turn %d (%s, %d bytes): expected %r, said %r" %
                        (d["id"], r["turn"], k, dist, r["answer"], item["said"]))
            items.append(item)
    n_ok = sum(i["ok"] for i in items)
    return {"recall": n_ok / max(1, len(items)), "correct": n_ok, "questions": len(items),
            "per_kind": {k: {"recall": v[0] / v[1], "n": v[1]} for k, v in sorted(per_kind.items())},
            "per_distance": {k: {"recall": v[0] / v[1], "n": v[1]} for k, v in sorted(
                per_dist.items(), key=lambda kv: dist_order(kv[0]))},
            "items": items}


def dist_order(name):
    """Sort key of a distance bucket name ("0-127", "512+", "?" for no fact position: last)."""
    head = name.split("-")[0].rstrip("+")
    return int(head) if head.isdigit() else 1 << 30


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model.bin (llama2.c legacy export)")
    ap.add_argument("--data", required=True, help="jsonl in the dialogue schema")
    ap.add_argument("--limit", type=int, default=0, help="first N dialogues only")
    ap.add_argument("--show", type=int, default=3, help="decode and print the first N misses")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--c-bin", help="score with the project's C forward pass (FP32): path of ckv-agentlm-logits")
    ap.add_argument("--jobs", type=int, default=1, help="C processes at a time (with --c-bin)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = load_bin(a.model).eval()
    ds = load_jsonl(a.data)
    if a.limit:
        ds = ds[: a.limit]
    res = evaluate(m, ds, a.show, log=lambda s: print(s, file=sys.stderr), c_bin=a.c_bin, model_path=a.model,
                   jobs=a.jobs)
    if a.json:
        print(json.dumps(res))
        return
    print("recall %.4f (%d/%d) on %d dialogues of %s, %s forward pass" % (
        res["recall"], res["correct"], res["questions"], len(ds), a.data,
        "C (examples/llm/model.c, FP32)" if a.c_bin else "PyTorch (FP32)"))
    for title, tab in (("per fact kind", res["per_kind"]), ("per distance (bytes)", res["per_distance"])):
        print(title + ":")
        for k, v in tab.items():
            print("  %-18s %.4f  (n=%d)" % (k, v["recall"], v["n"]))


if __name__ == "__main__":
    main()
