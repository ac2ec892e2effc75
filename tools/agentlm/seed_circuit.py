"""seed_circuit.py - starts training with previous-token heads already in layer 0.

Why: an induction head (find where the current bytes occurred before, copy
what followed) needs two heads that are useless alone: one in an early layer
that writes "the byte before me" into each position, and one later that
matches the current byte against it.  Gradient descent finds the pair late
and suddenly (the "phase change"); on this machine's CPUs three runs of
10-20M tokens never reached it (README.md, runs 2 and 3).  Seeding the first
half of the pair breaks the deadlock: the matching head then has a direct
gradient from the first step.  Everything stays an ordinary Llama (the
llama2.c file and examples/llm/model.c are unchanged); the seeded weights are
only a starting point and train like all others.

The layout written into a fresh model (dim D, head_dim 64, RoPE as model.py):
- token embedding: content in dims [0, C) (C = D/2), a constant KAPPA in the
  last dim for every token (the tied classifier adds the same number to every
  logit for it: no effect on the softmax);
- layer 0, every KV head: key = a constant vector read from the last dim, in
  the 8 highest RoPE frequencies only; query head h of the layer = that key
  rotated back by OFFSETS[h] positions, so q.k after RoPE is
  A * sum_j cos((m - n - d) * theta_j): largest at n = m - d, at least 8
  logits above any other position in a 1024-byte window;
- layer 0 values: a random projection of the content dims; the output
  projection writes head h's 64 values, randomly projected, into its own
  slot of (D - C - 1) / n_heads residual dims after the content.
So after layer 0 each position carries the content of the bytes 1..n_heads
before it, in separate subspaces, and a later head can match several bytes
of context at once.
"""
import math
import os
import sys

import torch

OFFSETS = (1, 2, 3, 4)   # bytes back, per query head of layer 0
FREQ_PAIRS = 8           # RoPE pairs the positional query/key use (the fastest ones)
MARGIN_LOGITS = 8.0      # peak minus best other position, in attention logits
CONTENT_STD = 0.03       # embedding std on the content dims
COPY_GAIN = 4.0          # induction output, in units of the content scale


def rope_freqs(head_dim):
    return [10000.0 ** (-2.0 * j / head_dim) for j in range(head_dim // 2)]


def seed_previous_token_heads(model, seed=0):
    """Overwrite the token embedding and layer 0's attention of a fresh AgentLM."""
    c = model.c
    D, hd, H, KV = c.dim, c.head_dim, c.n_heads, c.n_kv_heads
    if H > len(OFFSETS) or hd < 2 * FREQ_PAIRS:
        raise ValueError("seed_circuit: needs at most %d query heads and head_dim >= %d"
                         % (len(OFFSETS), 2 * FREQ_PAIRS))
    g = torch.Generator().manual_seed(seed)
    C = D // 2
    last = D - 1
    slot = (D - C - 1) // H
    kappa = CONTENT_STD * math.sqrt(C)  # rms of a whole embedding row about CONTENT_STD*sqrt(2)
    th = rope_freqs(hd)
    # the span of one pair's cos sum: margin to the neighbours is sum_j (1 - cos theta_j)
    margin1 = sum(1.0 - math.cos(th[j]) for j in range(FREQ_PAIRS))
    # attention logit at the peak = amp^2 * FREQ_PAIRS / sqrt(hd); margin = amp^2 * margin1 / sqrt(hd)
    amp = math.sqrt(MARGIN_LOGITS * math.sqrt(hd) / margin1)
    with torch.no_grad():
        E = model.tok.weight
        E.zero_()
        E[:, :C] = torch.randn(E.shape[0], C, generator=g) * CONTENT_STD
        E[:, last] = kappa
        # rms of a row = sqrt((C*std^2 + kappa^2) / D); RMSNorm makes the last dim about:
        rms = math.sqrt((C * CONTENT_STD ** 2 + kappa ** 2) / D)
        const_in = kappa / rms
        L0 = model.layers[0]
        L0.attn_norm.weight.fill_(1.0)
        wq, wk, wv, wo = L0.wq.weight, L0.wk.weight, L0.wv.weight, L0.wo.weight
        wq.zero_(); wk.zero_(); wv.zero_(); wo.zero_()
        group = H // KV
        for kvh in range(KV):
            for j in range(FREQ_PAIRS):
                wk[kvh * hd + 2 * j, last] = amp / const_in
            # values: content (about N(0,1) a dim after the norm) -> 64 dims about N(0,1)
            wv[kvh * hd:(kvh + 1) * hd, :C] = torch.randn(hd, C, generator=g) / math.sqrt(C)
        for h in range(H):
            d = OFFSETS[h]
            for j in range(FREQ_PAIRS):
                wq[h * hd + 2 * j, last] = amp * math.cos(d * th[j]) / const_in
                wq[h * hd + 2 * j + 1, last] = -amp * math.sin(d * th[j]) / const_in
            r0 = C + h * slot
            wo[r0:r0 + slot, h * hd:(h + 1) * hd] = (torch.randn(slot, hd, generator=g)
                                                     * CONTENT_STD / math.sqrt(hd))
    return {"offsets": list(OFFSETS[:H]), "content_dims": C, "slot_dims": slot,
            "amp": amp, "kappa": kappa}


def seed_copy_values(model, layer=1, seed=0):
    """The output-value half of an induction head in `layer`, KV head 0: values
    read a random 64-d projection R of the content dims, query heads 0 and 1
    write R^T back onto them, so whatever position they attend to raises the
    logit of its own byte (the classifier is the embedding).  The query-key
    half (which position to attend to) is left to training: with the values
    already useful it gets a direct gradient."""
    c = model.c
    D, hd, H, KV = c.dim, c.head_dim, c.n_heads, c.n_kv_heads
    C = D // 2
    g = torch.Generator().manual_seed(seed + 1)
    R = torch.linalg.qr(torch.randn(C, hd, generator=g))[0].T  # hd x C, orthonormal rows
    L = model.layers[layer]
    with torch.no_grad():
        L.wv.weight[0:hd].zero_()
        L.wv.weight[0:hd, :C] = R
        for h in range(H // KV):
            L.wo.weight[:, h * hd:(h + 1) * hd].zero_()
            L.wo.weight[:C, h * hd:(h + 1) * hd] = R.T * CONTENT_STD * COPY_GAIN


MATCH_PAIRS = (22, 32)   # RoPE pairs the matching query/key use: slow enough for ~1000 bytes
MATCH_LOGITS = 12.0      # attention logit of a one-byte match


def seed_match(model, layer=1, seed=0):
    """The query-key half of the induction head in `layer` (KV head 0, query
    heads 0 and 1): the key of position n is a code of byte n-1 (read from
    layer 0's offset-1 slot), the query of position m the same code of byte m
    (computed from the content dims through the same map layer 0 uses), plus,
    with half the weight, byte n-2 against byte m-1 (offset-2 slot against the
    offset-1 slot).  Only the slow RoPE pairs MATCH_PAIRS carry it, so the match
    holds across the window.  Measured on the residual stream of the seeded
    model itself (a least-squares fit), so the norms' scaling is included."""
    c = model.c
    D, hd, H = c.dim, c.head_dim, c.n_heads
    C = D // 2
    slot = (D - C - 1) // H
    g = torch.Generator().manual_seed(seed + 2)
    p0, p1 = MATCH_PAIRS
    dims = [2 * j + t for j in range(p0, p1) for t in (0, 1)]
    nd = len(dims)
    with torch.no_grad():
        # residual after layer 0 for every byte at a position where bytes m-1.. are random
        ids = torch.randint(0, 256, (8, 256), generator=g)
        x = model.tok(ids)
        L0 = model.layers[0]
        x = L0(x, model.cos[:256], model.sin[:256])
        L = model.layers[layer]
        xn = L.attn_norm(x)[:, 8:]          # (B, T', D)
        cur = ids[:, 8:]
        s1 = xn[..., C:C + slot]            # code of byte m-1
        s2 = xn[..., C + slot:C + 2 * slot]  # code of byte m-2
        cont = xn[..., :C]
        # fit content -> the offset-1 slot code of the same byte: s1 at m+1 from content at m
        X = cont[:, :-1].reshape(-1, C)
        Y1 = s1[:, 1:].reshape(-1, slot)
        M1 = torch.linalg.lstsq(X, Y1).solution      # C x slot
        # offset-1 slot at m -> offset-2 slot at m+1 (both code byte m-1)
        X2 = s1[:, :-1].reshape(-1, slot)
        Y2 = s2[:, 1:].reshape(-1, slot)
        M2 = torch.linalg.lstsq(X2, Y2).solution     # slot x slot
        G = torch.randn(nd // 2, slot, generator=g) / math.sqrt(slot)
        code_var = (Y1 @ G.T).pow(2).sum(-1).mean().item()
        lam = math.sqrt(MATCH_LOGITS * math.sqrt(hd) / code_var)
        wq, wk = L.wq.weight, L.wk.weight
        wq[0:2 * hd].zero_()
        wk[0:hd].zero_()
        half = nd // 2
        for h in range(2):
            base = h * hd
            for i in range(half):
                # first half of the pairs: byte m vs byte n-1; second half: m-1 vs n-2
                wq[base + dims[i], :C] = lam * (M1 @ G[i])
                wq[base + dims[half + i], C:C + slot] = lam * 0.7 * (M2 @ G[i])
        for i in range(half):
            wk[dims[i], C:C + slot] = lam * G[i]
            wk[dims[half + i], C + slot:C + 2 * slot] = lam * G[i]
    return {"match_dims": nd, "lambda": lam}


class Frozen:
    """Keeps the positional part of the seeded circuit as seeded: the constant
    embedding dim, layer 0's norm weight on it and layer 0's query and key
    weights are restored after every optimiser step (weight decay and noise
    would erase them before anything learns to use them)."""

    def __init__(self, model):
        L0 = model.layers[0]
        self.items = [(model.tok.weight, (slice(None), model.c.dim - 1)),
                      (L0.attn_norm.weight, (slice(model.c.dim - 1, None),)),
                      (L0.wq.weight, (slice(None),)), (L0.wk.weight, (slice(None),))]
        self.saved = [p[idx].detach().clone() for p, idx in self.items]

    def restore(self):
        with torch.no_grad():
            for (p, idx), v in zip(self.items, self.saved):
                p[idx] = v


def layer0_attention_to_offsets(model, ids):
    """Mean attention weight layer 0's head h gives to position m - OFFSETS[h] (a check)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model import apply_rope
    c = model.c
    with torch.no_grad():
        x = model.tok(ids)
        L0 = model.layers[0]
        h = L0.attn_norm(x)
        B, T, _ = x.shape
        q = L0.wq(h).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = L0.wk(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = model.cos[:T], model.sin[:T]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.repeat_interleave(c.n_heads // c.n_kv_heads, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(c.head_dim)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        a = torch.softmax(s, -1)
        out = []
        for hh in range(c.n_heads):
            d = OFFSETS[hh]
            idx = torch.arange(d, T)
            out.append(a[:, hh, idx, idx - d].mean().item())
        return out


if __name__ == "__main__":
    # The check the README cites: seed a fresh default model, print the share of
    # layer 0 attention each query head puts on its offset (measured 0.993 each).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model import AgentLM, Config
    torch.manual_seed(0)
    m = AgentLM(Config())
    seed_previous_token_heads(m)
    print("layer 0 attention on offsets %s: %s" % (list(OFFSETS), [round(x, 4) for x in
          layer0_attention_to_offsets(m, torch.randint(0, 257, (2, 1024)))]))
