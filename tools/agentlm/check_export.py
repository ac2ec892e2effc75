#!/usr/bin/python3
"""check_export.py - the exported model computes in C what it computes in PyTorch.

Reads MODEL (llama2.c legacy export of train.py), runs the PyTorch forward
(FP32, CPU) over BOS + the bytes of a prompt, runs the project's C forward
pass (ckv-agentlm-logits, examples/llm/model.c) over the same bytes, and
compares the logits of every position.  The prompt is a dialogue from gen.py
(--seed, --index) unless --prompt FILE names one.  Exit 0 when the largest
absolute difference is below --tol, 1 otherwise.

  check_export.py --model build/agentlm/model.bin --c-bin build/bin/ckv-agentlm-logits
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402
from data import render_spans  # noqa: E402
from model import BOS, VOCAB, load_bin  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--c-bin", required=True, help="path of ckv-agentlm-logits")
    ap.add_argument("--prompt", help="file of prompt bytes (default: a generated dialogue)")
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    m = load_bin(a.model).eval()
    if a.prompt:
        body = open(a.prompt, "rb").read()
    else:
        body, _ = render_spans(gen.sample(a.seed, "dialogue", a.index))
    body = body[: m.c.seq_len - 1]
    with torch.no_grad():
        ref = m(torch.tensor([[BOS] + list(body)]))[0].numpy()
    with tempfile.TemporaryDirectory() as td:
        pf, of = os.path.join(td, "prompt"), os.path.join(td, "logits")
        open(pf, "wb").write(body)
        p = subprocess.run([a.c_bin, a.model, pf, of], capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stderr.strip())
            return 1
        c_logits = np.fromfile(of, dtype="<f4").reshape(-1, VOCAB)
    diff = np.abs(c_logits - ref)
    agree = float((c_logits.argmax(-1) == ref.argmax(-1)).mean())
    print("C: %s" % p.stdout.strip())
    print("positions %d, max |logit diff| %.3g (mean %.3g, logit range %.3g..%.3g), argmax agreement %.4f"
          % (len(ref), diff.max(), diff.mean(), ref.min(), ref.max(), agree))
    return 0 if diff.max() < a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
