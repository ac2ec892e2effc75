"""model.py - the agent LM in PyTorch, computed exactly as examples/llm/model.c does.

A Llama over bytes: vocabulary 257 (ids 0..255 are bytes, 256 is BOS).  Per
layer: xb = rmsnorm(x) (eps 1e-5, weight after the scale); q, k, v = wq/wk/wv @
xb; q and k rotated by RoPE with theta 10000 on the pairs (2j, 2j+1) of each
head (angle = pos * 10000^(-2j/head_dim), as llama2.c); causal softmax
attention with scale 1/sqrt(head_dim), query head h reading KV head
h / (n_heads / n_kv_heads) (grouped-query attention); x += wo @ heads; then
x += w2 @ (silu(w1 @ rmsnorm(x)) * (w3 @ rmsnorm(x))).  Logits = embedding @
rmsnorm(x) (the classifier is tied to the token embedding).

export() writes the llama2.c legacy checkpoint that examples/llm loads: a header
of 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size > 0 for
the shared classifier, seq_len), then float32 arrays: token_embedding,
rms_att_weight, wq, wk, wv, wo, rms_ffn_weight, w1, w2, w3, rms_final_weight,
freq_cis_real, freq_cis_imag (seq_len x head_dim/2 each).
"""
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 257
BOS = 256
RMS_EPS = 1e-5
ROPE_THETA = 10000.0


class Config:
    def __init__(self, dim=256, hidden_dim=768, n_layers=4, n_heads=4, n_kv_heads=2, seq_len=1024):
        self.dim, self.hidden_dim, self.n_layers = dim, hidden_dim, n_layers
        self.n_heads, self.n_kv_heads, self.seq_len = n_heads, n_kv_heads, seq_len
        assert dim % n_heads == 0 and n_heads % n_kv_heads == 0
        self.head_dim = dim // n_heads
        assert self.head_dim % 2 == 0

    def as_dict(self):
        return {k: getattr(self, k) for k in ("dim", "hidden_dim", "n_layers", "n_heads",
                                              "n_kv_heads", "seq_len")}


def rope_tables(seq_len, head_dim):
    """cos, sin of shape (seq_len, head_dim/2), angles computed in float64 like model.c."""
    j = torch.arange(0, head_dim, 2, dtype=torch.float64)
    freq = ROPE_THETA ** (-j / head_dim)
    ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x: (B, heads, T, head_dim); rotates pairs (2j, 2j+1)."""
    a, b = x[..., 0::2], x[..., 1::2]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    return torch.stack((ra, rb), dim=-1).flatten(-2)


def causal_gqa_attention(q, k, v, n_kv_heads, chunk=256):
    """Causal softmax attention, scale 1/sqrt(head_dim), query head h reading KV
    head h // (n_heads / n_kv_heads).  q: (B, H, T, d); k, v: (B, KV, T, d).

    The query heads of a KV head are stacked along the time axis, (B, KV,
    group*T, d), so K and V are never repeated; queries go in chunks of
    `chunk` positions, each against the keys up to its own end only (the
    causal mask makes the rest zero), which skips about half the score matrix.
    Exact: the same softmax over the same keys as the full masked product."""
    B, H, T, d = q.shape
    group = H // n_kv_heads
    scale = 1.0 / math.sqrt(d)
    qg = q.reshape(B, n_kv_heads, group, T, d)
    outs = []
    for s0 in range(0, T, chunk):
        s1 = min(T, s0 + chunk)
        qc = qg[:, :, :, s0:s1, :].reshape(B * n_kv_heads, group * (s1 - s0), d)
        kc = k[:, :, :s1, :].reshape(B * n_kv_heads, s1, d)
        vc = v[:, :, :s1, :].reshape(B * n_kv_heads, s1, d)
        # -inf where key position > query position
        qpos = torch.arange(s0, s1, device=q.device)
        mask = torch.zeros(s1 - s0, s1, device=q.device, dtype=q.dtype)
        mask.masked_fill_(torch.arange(s1, device=q.device)[None, :] > qpos[:, None], float("-inf"))
        mask = mask.repeat(group, 1)
        sc = torch.baddbmm(mask, qc, kc.transpose(1, 2), alpha=scale)
        oc = torch.softmax(sc, dim=-1) @ vc
        outs.append(oc.view(B, n_kv_heads, group, s1 - s0, d))
    return torch.cat(outs, dim=3).reshape(B, H, T, d)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return (self.weight * y).type_as(x)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.chunk = 256  # query positions per attention chunk (causal_gqa_attention)
        kv_dim = c.n_kv_heads * c.head_dim
        self.attn_norm = RMSNorm(c.dim)
        self.wq = nn.Linear(c.dim, c.dim, bias=False)
        self.wk = nn.Linear(c.dim, kv_dim, bias=False)
        self.wv = nn.Linear(c.dim, kv_dim, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)
        self.ffn_norm = RMSNorm(c.dim)
        self.w1 = nn.Linear(c.dim, c.hidden_dim, bias=False)
        self.w2 = nn.Linear(c.hidden_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.hidden_dim, bias=False)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = causal_gqa_attention(q, k, v, c.n_kv_heads, self.chunk)
        x = x + self.wo(o.transpose(1, 2).reshape(B, T, c.dim))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class AgentLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(VOCAB, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim)
        cos, sin = rope_tables(c.seq_len, c.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)
        # GPT-2 style: residual projections scaled down with depth
        for n, p in self.named_parameters():
            if n.endswith("wo.weight") or n.endswith("w2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x), self.tok.weight)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def export(model, path):
    """Write the llama2.c legacy checkpoint (FP32, shared classifier)."""
    c = model.c
    L = model.layers

    def cat(name):
        return torch.stack([getattr(b, name).weight.detach().float().cpu() for b in L])

    def norms(name):
        return torch.stack([getattr(b, name).weight.detach().float().cpu() for b in L])

    cos, sin = rope_tables(c.seq_len, c.head_dim)
    arrays = [model.tok.weight.detach().float().cpu(), norms("attn_norm"), cat("wq"), cat("wk"),
              cat("wv"), cat("wo"), norms("ffn_norm"), cat("w1"), cat("w2"), cat("w3"),
              model.norm.weight.detach().float().cpu(), cos, sin]
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                            VOCAB, c.seq_len))
        for a in arrays:
            f.write(a.contiguous().numpy().astype("<f4").tobytes())


def load_bin(path):
    """Read a legacy checkpoint written by export() back into an AgentLM (FP32, CPU)."""
    import numpy as np
    raw = open(path, "rb").read()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
    if vocab != VOCAB:
        raise ValueError("%s: vocab_size %d, expected %d (shared classifier)" % (path, vocab, VOCAB))
    c = Config(dim, hidden, layers, heads, kv_heads, seq_len)
    m = AgentLM(c)
    w = np.frombuffer(raw, dtype="<f4", offset=28)
    kv = kv_heads * c.head_dim
    off = [0]

    def take(*shape):
        n = 1
        for s in shape:
            n *= s
        t = torch.from_numpy(w[off[0]:off[0] + n].copy()).view(*shape)
        off[0] += n
        return t

    with torch.no_grad():
        m.tok.weight.copy_(take(VOCAB, dim))
        for name, shape in (("attn_norm", (dim,)), ("wq", (dim, dim)), ("wk", (kv, dim)),
                            ("wv", (kv, dim)), ("wo", (dim, dim)), ("ffn_norm", (dim,)),
                            ("w1", (hidden, dim)), ("w2", (dim, hidden)), ("w3", (hidden, dim))):
            t = take(layers, *shape)
            for i, b in enumerate(m.layers):
                getattr(b, name).weight.copy_(t[i])
        m.norm.weight.copy_(take(dim))
    take(seq_len, c.head_dim // 2)
    take(seq_len, c.head_dim // 2)
    if off[0] != w.size:
        raise ValueError("%s: %d floats left over" % (path, w.size - off[0]))
    return m
