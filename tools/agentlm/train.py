#!/usr/bin/python3
"""train.py - trains the byte-level agent LM on gen.py's dialogues, exports it.

Data: --dialogues N dialogues from gen.py with --seed (never the public file),
plus copy-curriculum samples (--copy-short, --copy-long; training only).  The
curriculum: the share of short-range copy samples in a batch falls linearly
from --short-start to --short-end over the first --curriculum-frac of the
steps, the long-range share rises from 0 to --long-share, dialogues fill the
rest.  Answer bytes weigh --answer-weight in the loss (data.py).

Repeat samples (--repeat N, training only) teach copying itself: random
strings, each either new (no loss: it cannot be predicted) or a repeat of an
earlier one of the same window (answer weight: it can only be predicted by
looking back), so most of their bytes need an induction head.  Their share
falls linearly from --repeat-start to --repeat-end over --curriculum-frac.
A model trained on dialogues alone (run 2, 20M tokens) had no such head: its
loss on the second copy of a random string was no lower than on the first.
--init-from CKPT starts from another run's weights (fresh optimiser and
schedule).

Optimiser: AdamW (betas 0.9/0.95, weight decay on matrices only), linear
warmup then cosine to --min-lr-frac of --lr.  --device cuda uses bf16 autocast
(master weights FP32).  Seeds: torch, the batch sampler and the generator all
derive from --seed, so a run on the same device and library repeats itself.

--minutes M runs the schedule over M minutes of wall time instead (the GPU
run: its length is fixed whatever the speed); the steps it reached are written
to config.json, and --steps with that number repeats the run without the
clock.

Writes into --outdir: ckpt.pt (model, optimiser, step; every --ckpt-every steps
and at the end; --resume continues from it), log.jsonl (one line per
--log-every steps: loss, answer loss, lr, tokens/s), model.bin (llama2.c
legacy export, see model.py) and config.json.

  train.py --device cpu --steps 200 --batch 8 --dim 128 --n-heads 2 --n-kv-heads 1 ...
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402
from data import encode  # noqa: E402
from model import BOS, AgentLM, Config, export, n_params  # noqa: E402


def gen_chunk(job):
    """Generate and encode samples start..start+count of one kind: (ids int16
    [n, seq_len+1], weight codes uint8 [n, seq_len]: 0 pad, 1 byte, 2 answer, 3 answer
    value, tokens)."""
    import numpy as np
    seed, kind, start, count, max_bytes, seq_len = job
    ids = np.zeros((count, seq_len + 1), dtype=np.int16)
    codes = np.zeros((count, seq_len), dtype=np.uint8)
    tokens = 0
    for j, i in enumerate(range(start, start + count)):
        a, w, n = encode(gen.sample(seed, kind, i, max_bytes), seq_len, 2.0, 3.0)
        ids[j] = a
        codes[j] = w
        tokens += n - 1
    return ids, codes, tokens


REPEAT_ALPHABET = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -.:"


def repeat_sample(seed, i, seq_len):
    """(ids seq_len+1, weight codes seq_len) of repeat sample i: BOS, then lines
    of random strings, each new (code 0) or a copy of an earlier line (code 2)."""
    r = random.Random("%d:repeat:%d" % (seed, i))
    ids, codes, lines = [BOS], [], []
    while len(ids) < seq_len + 1:
        if lines and r.random() < 0.5:
            line, code = r.choice(lines), 2
        else:
            line = bytes(r.choice(REPEAT_ALPHABET) for _ in range(r.randint(6, 40)))
            lines.append(line)
            code = 0
        ids += list(line) + [10]
        codes += [code] * len(line) + [1]
    return ids[: seq_len + 1], codes[:seq_len]


def gen_repeat_chunk(job):
    import numpy as np
    seed, start, count, seq_len = job
    ids = np.zeros((count, seq_len + 1), dtype=np.int16)
    codes = np.zeros((count, seq_len), dtype=np.uint8)
    for j in range(count):
        a, c = repeat_sample(seed, start + j, seq_len)
        ids[j], codes[j] = a, c
    return ids, codes, count * seq_len


def make_pool(seed, kind, count, max_bytes, seq_len, workers):
    """All samples of one kind as tensors (ids int16, weight codes uint8) and their token count."""
    import numpy as np
    chunk = 2000
    if kind == "repeat":
        fn, jobs = gen_repeat_chunk, [(seed, s, min(chunk, count - s), seq_len) for s in range(0, count, chunk)]
    else:
        fn = gen_chunk
        jobs = [(seed, kind, s, min(chunk, count - s), max_bytes, seq_len) for s in range(0, count, chunk)]
    if workers > 1 and len(jobs) > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(workers) as p:
            parts = p.map(fn, jobs)
    else:
        parts = [fn(j) for j in jobs]
    ids = torch.from_numpy(np.concatenate([p[0] for p in parts]))
    codes = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    return ids, codes, sum(p[2] for p in parts)


def progress(step, elapsed, a):
    """How far the schedule is, 0..1: by steps, or by time with --minutes."""
    p = step / max(1, a.steps)
    if a.minutes:
        p = max(p, elapsed / (a.minutes * 60.0))
    return min(1.0, p)


def lr_at(step, p, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p0 = a.warmup / max(1, a.steps)
    t = max(0.0, (p - p0) / max(1e-9, 1 - p0))
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def mix_at(p, a):
    """Shares of (copy-short, copy-long, repeat) in the batch at schedule progress p."""
    t = min(1.0, p / max(1e-9, a.curriculum_frac))
    return (a.short_start + (a.short_end - a.short_start) * t, a.long_share * t,
            a.repeat_start + (a.repeat_end - a.repeat_start) * t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden-dim", type=int, default=768)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=1000, help="dialogue bytes, BOS included")
    ap.add_argument("--dialogues", type=int, default=20000)
    ap.add_argument("--copy-short", type=int, default=4000)
    ap.add_argument("--copy-long", type=int, default=4000)
    ap.add_argument("--short-start", type=float, default=0.5)
    ap.add_argument("--short-end", type=float, default=0.05)
    ap.add_argument("--long-share", type=float, default=0.15)
    ap.add_argument("--curriculum-frac", type=float, default=0.3)
    ap.add_argument("--repeat", type=int, default=0, help="repeat samples (random strings and their copies)")
    ap.add_argument("--repeat-start", type=float, default=0.3)
    ap.add_argument("--repeat-end", type=float, default=0.1)
    ap.add_argument("--novel-values", type=float, default=0.0,
                    help="share of made-up names, cities, colours and items in the dialogues (gen.NOVEL_SHARE)")
    ap.add_argument("--seed-circuit", action="store_true",
                    help="start with previous-token heads in layer 0 (seed_circuit.py)")
    ap.add_argument("--init-from", default="",
                    help="ckpt.pt of another run, or an exported model.bin: start from its weights")
    ap.add_argument("--task-weights", default="",
                    help="relative weights of the task kinds in the dialogues, e.g. flight=2 (others 1)")
    ap.add_argument("--answer-weight", type=float, default=4.0)
    ap.add_argument("--value-weight", type=float, default=None,
                    help="loss weight of an answer's value bytes (where it copies); default --answer-weight")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--ckpt-every", type=int, default=500)
    ap.add_argument("--minutes", type=float, default=0,
                    help="run the schedule (warmup, cosine, curriculum) over this much wall time instead of "
                         "--steps, stopping at whichever ends first; the steps reached go to config.json")
    ap.add_argument("--workers", type=int, default=1, help="processes generating the data")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2)")
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast on the CPU too (master weights FP32; about 1.5x on CPUs with "
                         "AMX or AVX512_BF16; CUDA always uses it)")
    ap.add_argument("--outdir", default="build/agentlm")
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    os.makedirs(a.outdir, exist_ok=True)
    dev = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # data first: the generator's worker processes fork before CUDA starts
    gen.NOVEL_SHARE = a.novel_values
    if a.task_weights:
        gen.TASK_WEIGHTS = {k: float(v) for k, v in (kv.split("=") for kv in a.task_weights.split(","))}
        print("task weights: %s" % gen.TASK_WEIGHTS, flush=True)
    t0 = time.time()
    pools = {}
    for kind, count in (("dialogue", a.dialogues), ("copy-short", a.copy_short), ("copy-long", a.copy_long),
                        ("repeat", a.repeat)):
        if count > 0:
            ids, codes, tok = make_pool(a.seed, kind, count, a.max_bytes, a.seq_len, a.workers)
            pools[kind] = (ids, codes)
            print("data: %d %s samples, %d tokens" % (count, kind, tok), flush=True)
    print("data generated in %.1f s" % (time.time() - t0), flush=True)
    cfg = Config(a.dim, a.hidden_dim, a.n_layers, a.n_heads, a.n_kv_heads, a.seq_len)
    model = AgentLM(cfg)
    if a.seed_circuit:
        from seed_circuit import Frozen, seed_copy_values, seed_match, seed_previous_token_heads
        print("seeded circuit: %s" % seed_previous_token_heads(model, a.seed), flush=True)
        seed_copy_values(model, 1, a.seed)
        print("seeded match: %s" % seed_match(model, 1, a.seed), flush=True)
    model = model.to(dev)
    pools = {k: (ids.to(dev), codes.to(dev)) for k, (ids, codes) in pools.items()}
    print("model: %s, %d parameters" % (cfg.as_dict(), n_params(model)), flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    step = 0
    if a.init_from:
        if a.init_from.endswith(".bin"):
            from model import load_bin
            src = load_bin(a.init_from)
            if src.c.as_dict() != cfg.as_dict():
                sys.exit("train.py: %s is %s, not %s" % (a.init_from, src.c.as_dict(), cfg.as_dict()))
            model.load_state_dict(src.state_dict())
        else:
            model.load_state_dict(torch.load(a.init_from, map_location=dev)["model"])
        print("weights from %s" % a.init_from, flush=True)
    ckpt_path = os.path.join(a.outdir, "ckpt.pt")
    if a.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=dev)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        print("resumed at step %d" % step, flush=True)
    frozen = Frozen(model) if a.seed_circuit else None
    fwd = torch.compile(model) if a.compile and hasattr(torch, "compile") else model
    with open(os.path.join(a.outdir, "config.json"), "w") as f:
        json.dump({"model": cfg.as_dict(), "args": vars(a)}, f, indent=1)

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "config": cfg.as_dict()}, ckpt_path)

    log = open(os.path.join(a.outdir, "log.jsonl"), "a")
    value_weight = a.answer_weight if a.value_weight is None else a.value_weight
    weight_of = torch.tensor([0.0, 1.0, a.answer_weight, value_weight], device=dev)  # by weight code
    g = torch.Generator().manual_seed(a.seed * 1000003 + step)
    t_start, tok_window, t_window = time.time(), 0, time.time()
    p = progress(step, 0.0, a)
    while p < 1.0:
        lr = lr_at(step, p, a)
        for grp in opt.param_groups:
            grp["lr"] = lr
        ps, pl, pr = mix_at(p, a)
        # how many rows of the batch come from each pool
        u = torch.rand(a.batch, generator=g)
        kinds = [("copy-short" if x < ps else "copy-long" if x < ps + pl else
                  "repeat" if x < ps + pl + pr else "dialogue") for x in u.tolist()]
        kinds = [k if k in pools else "dialogue" for k in kinds]
        rows_ids, rows_w, row_is_dialogue = [], [], []
        for k in ("dialogue", "copy-short", "copy-long", "repeat"):
            m = kinds.count(k)
            if m == 0:
                continue
            row_is_dialogue += [k == "dialogue"] * m
            ids, w = pools[k]
            sel = torch.randint(0, ids.shape[0], (m,), generator=g).to(dev)
            rows_ids.append(ids[sel])
            rows_w.append(w[sel])
        ids = torch.cat(rows_ids).long()
        cw = torch.cat(rows_w)
        w = weight_of[cw.long()]
        x, y = ids[:, :-1], ids[:, 1:]
        if a.device == "cuda" or a.bf16:
            with torch.autocast(a.device, dtype=torch.bfloat16):
                logits = fwd(x)
        else:
            logits = fwd(x)
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                              reduction="none").view_as(w)
        loss = (nll * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        if frozen:
            frozen.restore()
        step += 1
        p = progress(step, time.time() - t_start, a)
        tok_window = tok_window + (cw > 0).sum()  # a tensor: no device sync per step
        if step % a.log_every == 0 or p >= 1.0:
            with torch.no_grad():
                plain = (nll * (w > 0)).sum() / (w > 0).sum()
                am = cw >= 2
                ans = (nll * am).sum() / am.sum().clamp(min=1)
                # the answers of dialogues alone: what the public evaluation asks
                dm = am & torch.tensor(row_is_dialogue, device=dev)[:, None]
                dans = (nll * dm).sum() / dm.sum().clamp(min=1)
            if a.device == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t_window
            rec = {"step": step, "loss": round(loss.item(), 4), "byte_nll": round(plain.item(), 4),
                   "answer_nll": round(ans.item(), 4),
                   "dialogue_answer_nll": round(dans.item(), 4), "lr": lr, "progress": round(p, 4),
                   "short": round(ps, 3), "long": round(pl, 3), "repeat": round(pr, 3),
                   "tok_s": round(float(tok_window) / dt, 1), "elapsed_s": round(time.time() - t_start, 1)}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(json.dumps(rec), flush=True)
            tok_window, t_window = 0, time.time()
        if a.ckpt_every and step % a.ckpt_every == 0:
            save()
    save()
    with open(os.path.join(a.outdir, "config.json"), "w") as f:
        json.dump({"model": cfg.as_dict(), "args": vars(a), "steps_done": step,
                   "minutes": round((time.time() - t_start) / 60, 2)}, f, indent=1)
    out = os.path.join(a.outdir, "model.bin")
    export(model, out)
    print("exported %s (%d bytes) after %d steps, %.1f min" %
          (out, os.path.getsize(out), step, (time.time() - t_start) / 60), flush=True)


if __name__ == "__main__":
    main()
