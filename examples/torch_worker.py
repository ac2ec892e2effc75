#!/usr/bin/env python3
"""torch_worker.py - a PyTorch worker whose KV cache lives in commitkvd.

    PYTHONPATH=build/python python3 examples/torch_worker.py --dialogues FILE.jsonl
        [--model PATH] [--policy NAME] [--param key=value ...] [--limit N] [--bos ID]
        [--socket EP] [--attach-socket PATH] [--prefix ID] [--keep] [--sync] [--json] [--quiet]

The Python twin of commitkv-dialogue (examples/llm/dialogue_run.c over
examples/llm/worker.c), through the `commitkv` module: a llama2.c legacy
checkpoint (the format of ../shared/models/README.md) run token by token in
PyTorch (FP32, CPU), the forward pass of examples/llm/model.c (RMSNorm eps
1e-5 with the weight after the scale, RoPE theta 10000 recomputed in double on
the pairs (2j, 2j+1), SwiGLU, grouped-query attention, tied or separate
classifier), split at the attention step, and summed in model.c's order: the
K/V it writes are the C worker's bit for bit (tests/python/test_torch_worker.py
reads both back from the daemon).  Per layer the token's K/V, rounded
to FP16, go into its draft slot in the daemon (`session.write_kv`), and the
attention is the daemon's fused mixed-format kernel over the session's view
(`session.attention`), whose per-position attention mass is summed over
layers and tokens and reported at the end of each round (`session.report`);
every new view epoch is acknowledged (`session.ack`).

Agent dialogues in the schema of ../shared/models/agent-dialogues.jsonl, as
commitkv-dialogue runs them: one session per dialogue, one round per turn:
BOS (round 1, role system, tagged turn start), then the bytes of "R: text\\n"
with the turn's role, the first byte tagged turn start, one byte a token.  At
an answer turn listed in "recall", "A: " is fed, then the model decodes
greedily (first argmax) until a newline or 200 bytes *aside*: the decoded
tokens never enter the session; then the dialogue goes on with the turn's
reference text.  The answer is right when it equals answer + "\\n" byte for
byte.  A dialogue longer than the model's positions is cut after its last
answer turn; one whose answers do not fit is skipped.

Decoding aside.  As the C worker, which puts the decoded tokens' K/V in a
private draft block that the kernel reads after the view's, the decoded
tokens go to session.attention as extra_k / extra_v: the module builds that
block, and the view tokens' mass during the decode counts for the round (the
decoded tokens' own does not).  The same attention as the C worker's, under
every policy.

Semantic scores: none are sent (the daemon estimates them from token
rarity), as commitkv-dialogue --semantic none does; compare with that.

Output: recall, and one line per answer; --json: one object with each
answer's bytes ("said_hex" exactly, "said" read as Latin-1), the same keys as
commitkv-dialogue --json where they exist.  Exit 0, 1 on a runtime failure, 2
on bad arguments or a malformed dialogue file.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import math
import os
import struct
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: idle OpenMP threads must not spin

import numpy as np  # noqa: E402
import torch  # noqa: E402

import commitkv  # noqa: E402

PROG = "torch_worker"
MAX_ANSWER = 200  # bytes decoded at most per answer
COLD_GATHER = 64  # cold tokens each query reads, gathered as the C worker does (examples/llm/worker.h LLM_GATHER_TOKENS)
BOS_BYTE_MODEL = 256  # BOS of a vocabulary of 257 (bytes + BOS)
BOS_DEFAULT = 1  # llama2.c's BOS otherwise
DEFAULT_MODEL_FILE = "stories260K.bin"
RMS_EPS = 1e-5
ROPE_THETA = 10000.0
NEWLINE = ord("\n")

ROLES = {"S": commitkv.Role.SYSTEM, "U": commitkv.Role.USER, "A": commitkv.Role.ASSISTANT,
         "T": commitkv.Role.TOOL}

# Fact kinds from the answer sentence (examples/llm/dialogues.c k_kinds).
KINDS = (("The table is on ", "booking_day"), ("The booking is under ", "booking_name"),
         ("Your booking code is ", "booking_code"), ("The table is for ", "booking_people"),
         ("The flight is on ", "flight_date"), ("The passenger is ", "flight_passenger"),
         ("You fly to ", "flight_city"), ("Your ticket number is ", "flight_ticket"),
         ("The price is ", "order_price"), ("You ordered ", "order_item"),
         ("Your order number is ", "order_number"), ("The reservation is for ", "hotel_name"),
         ("The hotel is in ", "hotel_city"), ("Your reservation code is ", "hotel_code"),
         ("The stay is ", "hotel_nights"))


class Failure(Exception):
    """A runtime failure with the text to print (exit 1)."""


class BadInput(Exception):
    """Bad arguments or a malformed dialogue file (exit 2)."""


# ---- the model ------------------------------------------------------------------


LANES = 8  # model.c matmul(): partial sums per output row

_LIBM = ctypes.util.find_library("m")
_expf = ctypes.CDLL(_LIBM).expf if _LIBM else None
if _expf is not None:
    _expf.restype, _expf.argtypes = ctypes.c_float, [ctypes.c_float]


def expf(x):
    """The C library's expf, element by element, as model.c's SiLU calls it:
    torch.exp in float32 differs from it in about 9% of values by an ulp,
    exp in double rounded to float in about 0.05% (glibc's expf is not always
    correctly rounded); either is enough to flip an FP16 K/V now and then.
    Without a findable libm: the double-rounded one."""
    if _expf is None:
        return torch.exp(x.double()).float()
    return torch.tensor([_expf(v) for v in x.tolist()], dtype=torch.float32)


class Linear:
    """out = W @ x summed in model.c's order, so the products and their sums
    are the C forward pass's bit for bit: per row, LANES partial sums over
    the columns in order, combined as ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7)),
    plus the sequential sum of the columns past the last full lane group.
    (torch.mv sums in BLAS order: the same to rounding, but a near-tie of two
    logits is then decided differently now and then.)"""

    def __init__(self, w):
        n, d = w.shape
        self.n, self.chunks = n, d // LANES
        self.w = w[:, :self.chunks * LANES].reshape(n, self.chunks, LANES).contiguous()
        self.tail = [w[:, j].contiguous() for j in range(self.chunks * LANES, d)]

    def __call__(self, x):
        cut = self.chunks * LANES
        p = self.w * x[:cut].view(self.chunks, LANES)
        acc = p[:, 0].clone()
        for c in range(1, self.chunks):
            acc += p[:, c]
        pair = acc[:, :4] + acc[:, 4:]  # a0+a4, a1+a5, a2+a6, a3+a7
        half = pair[:, 0::2] + pair[:, 1::2]  # (a0+a4)+(a1+a5), (a2+a6)+(a3+a7)
        tail = torch.zeros(self.n)
        for j, col in enumerate(self.tail):
            tail += col * x[cut + j]
        return (half[:, 0] + half[:, 1]) + tail


class Llama:
    """A llama2.c legacy checkpoint in PyTorch (FP32, CPU), stepped one token at
    a time: embed -> (qkv -> finish_layer) per layer -> logits, as model.c does
    it, in its order of operations (so, given the same attention outputs, the
    same bits)."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            raw = f.read()
        if len(raw) < 28:
            raise Failure(f"{path}: too short for a llama2.c header")
        dim, hidden, layers, heads, kv_heads, vocab, seq = struct.unpack("<7i", raw[:28])
        if min(dim, hidden, layers, heads, kv_heads, seq) <= 0 or vocab == 0 or dim % heads or heads % kv_heads \
                or (dim // heads) % 2 or dim < LANES:
            raise Failure(f"{path}: not a llama2.c legacy checkpoint (header {dim} {hidden} {layers} {heads} "
                          f"{kv_heads} {vocab} {seq})")
        shared = vocab > 0
        vocab = abs(vocab)
        hd = dim // heads
        kv = kv_heads * hd
        w = np.frombuffer(raw, dtype="<f4", offset=28)
        off = 0

        def take(*shape):
            nonlocal off
            n = int(np.prod(shape))
            if off + n > w.size:
                raise Failure(f"{path}: truncated")
            t = torch.from_numpy(w[off:off + n].astype(np.float32).reshape(shape))
            off += n
            return t

        tok = take(vocab, dim)
        self.rms_att = take(layers, dim)
        wq, wk, wv, wo = take(layers, dim, dim), take(layers, kv, dim), take(layers, kv, dim), take(layers, dim, dim)
        self.rms_ffn = take(layers, dim)
        w1, w2, w3 = take(layers, hidden, dim), take(layers, dim, hidden), take(layers, hidden, dim)
        self.rms_final = take(dim)
        take(seq, hd // 2)  # legacy RoPE tables (freq_cis_real, _imag): recomputed below
        take(seq, hd // 2)
        wcls = tok if shared else take(vocab, dim)
        if off != w.size:
            raise Failure(f"{path}: {w.size - off} floats left over")
        if not np.isfinite(w).all():
            raise Failure(f"{path}: a weight is NaN or infinite")
        self.tok = tok
        # Rows are summed independently: q, k, v (and w1, w3) from one product each.
        self.wqkv = [Linear(torch.cat((wq[i], wk[i], wv[i]))) for i in range(layers)]
        self.wo = [Linear(wo[i]) for i in range(layers)]
        self.w13 = [Linear(torch.cat((w1[i], w3[i]))) for i in range(layers)]
        self.w2 = [Linear(w2[i]) for i in range(layers)]
        self.wcls = Linear(wcls)
        self.dim, self.hidden, self.n_layers, self.n_heads, self.n_kv_heads = dim, hidden, layers, heads, kv_heads
        self.vocab, self.seq_len, self.head_dim, self.kv_dim = vocab, seq, hd, kv
        # model.c rope(): angle = pos * 10000^(-i/head_dim) in double (libm), cos/sin rounded to float.
        ang = [[p * math.pow(ROPE_THETA, -i / hd) for i in range(0, hd, 2)] for p in range(seq)]
        self.cos = torch.tensor([[math.cos(a) for a in row] for row in ang], dtype=torch.float64).float()
        self.sin = torch.tensor([[math.sin(a) for a in row] for row in ang], dtype=torch.float64).float()
        self.eps = np.float32(RMS_EPS)

    def _rmsnorm(self, x, w):
        """w * (1 / sqrt(mean(x^2) + eps) * x), the sum of squares in order (float32)."""
        ss = np.add.accumulate((x * x).numpy())[-1]
        scale = np.float32(1) / np.sqrt(ss / np.float32(x.numel()) + self.eps)
        return w * (float(scale) * x)

    def _rope(self, vec, n_heads, pos):
        p = vec.view(n_heads, self.head_dim // 2, 2)
        a, b = p[..., 0], p[..., 1]
        c, s = self.cos[pos], self.sin[pos]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).reshape(n_heads, self.head_dim)

    def embed(self, token: int):
        return self.tok[token].clone()

    def qkv(self, x, layer: int, pos: int):
        """q (n_heads, head_dim), k and v (n_kv_heads, head_dim), RoPE applied at pos."""
        xb = self._rmsnorm(x, self.rms_att[layer])
        q, k, v = self.wqkv[layer](xb).split((self.dim, self.kv_dim, self.kv_dim))
        return self._rope(q, self.n_heads, pos), self._rope(k, self.n_kv_heads, pos), \
            v.view(self.n_kv_heads, self.head_dim)

    def finish_layer(self, x, layer: int, att):
        """x after the layer, given the attention output (n_heads * head_dim)."""
        x = x + self.wo[layer](att)
        xb = self._rmsnorm(x, self.rms_ffn[layer])
        g, up = self.w13[layer](xb).split(self.hidden)
        h = g / (1.0 + expf(-g)) * up
        return x + self.w2[layer](h)

    def logits(self, x) -> np.ndarray:
        return self.wcls(self._rmsnorm(x, self.rms_final)).numpy()


# ---- the dialogues ---------------------------------------------------------------


class Dialogue:
    """One dialogue: id, turns [(role, text bytes)], recall {turn: (question_turn, answer bytes)}."""

    def __init__(self, obj: dict, where: str):
        if not isinstance(obj, dict):
            raise BadInput(f"{where}: not a JSON object")
        self.id = obj.get("id")
        if not isinstance(self.id, str) or not self.id:
            raise BadInput(f"{where}: \"id\" is missing or not a string")
        turns, recall = obj.get("turns"), obj.get("recall")
        if not isinstance(turns, list) or not turns:
            raise BadInput(f"{where}: \"turns\" is missing, empty or not an array")
        if not isinstance(recall, list):
            raise BadInput(f"{where}: \"recall\" is missing or not an array")
        self.turns = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or t.get("role") not in ROLES or not isinstance(t.get("text"), str):
                raise BadInput(f"{where}: turn {i}: wanted {{\"role\": S|U|A|T, \"text\": str}}")
            text = t["text"].encode("utf-8")
            if b"\n" in text or b"\0" in text:
                raise BadInput(f"{where}: turn {i}: \"text\" holds a NUL or a newline")
            self.turns.append((t["role"], text))
        self.recall = {}
        for i, r in enumerate(recall):
            ok = isinstance(r, dict) and all(isinstance(r.get(k), int) for k in ("turn", "question_turn")) \
                and isinstance(r.get("answer"), str) and r["answer"]
            if not ok or not 0 <= r["turn"] < len(turns) or not 0 <= r["question_turn"] < r["turn"]:
                raise BadInput(f"{where}: recall {i}: wanted {{\"turn\", \"question_turn\" < turn, \"answer\"}}")
            if self.turns[r["turn"]][0] != "A" or r["turn"] in self.recall:
                raise BadInput(f"{where}: recall {i}: turn {r['turn']} is not an assistant turn answered once")
            self.recall[r["turn"]] = (r["question_turn"], r["answer"].encode("utf-8"))

    @staticmethod
    def rendering(turn) -> bytes:
        role, text = turn
        return role.encode() + b": " + text + b"\n"

    def position(self, t: int) -> int:
        """Position of turn t's first byte (BOS is position 0)."""
        return 1 + sum(len(text) + 4 for _, text in self.turns[:t])

    def turns_that_fit(self, seq_len: int) -> int:
        """All turns when they fit in seq_len positions, else up to the last answer turn; 0 when even that does not."""
        last = max(self.recall) + 1 if self.recall else 0
        if self.position(len(self.turns)) <= seq_len:
            return len(self.turns)
        if last and self.position(last) <= seq_len:
            return last
        return 0


def load_dialogues(path: str, limit: int) -> list:
    out = []
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                if limit and len(out) == limit:
                    break
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise BadInput(f"{path}:{n}: {e}") from None
                out.append(Dialogue(obj, f"{path}:{n}"))
    except OSError as e:
        raise Failure(f"{path}: {e.strerror}") from None
    return out


def fact_kind(answer: bytes) -> str:
    text = answer.decode("utf-8", "replace")
    for prefix, kind in KINDS:
        if text.startswith(prefix):
            return kind
    return "note" if " note was " in text else "other"


# ---- one sequence in a session ----------------------------------------------------


class Worker:
    """One model sequence whose KV cache is a commitkvd session (worker.c's llm_worker)."""

    def __init__(self, model: Llama, session, sync: bool = False):
        self.m = model
        self.s = session
        self.sync = sync  # wait for each round's moves (commitkv-dialogue --sync): the same states every run
        m = model
        self.mass = np.zeros(m.seq_len, dtype=np.float32)  # this round's attention mass per position
        self.n_done = 0
        self.acked = 0
        self.logits = None
        self.steps = 0
        self.rounds = 0

    def _ack_newest(self):
        e = self.s.epoch
        if e > self.acked:
            self.s.ack(e)
            self.acked = e

    def token(self, token: int, role, tag):
        """Appends one token and runs it: K/V into its draft slot, fused attention over the view, per layer."""
        pos = self.s.append(1, roles=role, tags=tag, token_ids=token)
        if pos != self.n_done:
            raise Failure(f"{self.s.id}: the daemon put token {self.n_done} at position {pos}")
        m = self.m
        x = m.embed(token)
        for layer in range(m.n_layers):
            q, k, v = m.qkv(x, layer, pos)
            k16, v16 = k.to(torch.float16), v.to(torch.float16)
            self.s.write_kv(pos, layer, k16, v16)
            out, mass = self.s.attention(layer, q, cold_gather=COLD_GATHER)
            if layer == 0:
                self._ack_newest()  # the view just read is the newest: nothing older is read after this
            self.mass[:mass.size] += mass
            x = m.finish_layer(x, layer, torch.from_numpy(out).reshape(-1))
        self.logits = m.logits(x)
        self.n_done = pos + 1
        self.steps += 1

    def end_round(self, round_no: int):
        """Reports the round's mass for every position so far, acknowledges its epoch, starts the next round."""
        r = self.s.report(round_no, self.mass[:self.n_done])
        if self.sync and r.pending:
            self.s.settle()
        if r.epoch > self.acked:
            self.s.ack(r.epoch)
            self.acked = r.epoch
        self.mass[:] = 0
        self.rounds = round_no

    # -- decoding aside --

    def decode_aside(self, max_tokens: int, stop: int, end: int):
        """Greedy decoding that appends nothing (worker.c llm_worker_decode_aside): tokens, and why it
        stopped: 's' after `stop`, 'e' before `end`, 'l' at max_tokens, 'c' out of positions."""
        m = self.m
        ak = np.zeros((m.n_layers, max_tokens, m.n_kv_heads, m.head_dim), dtype=np.float16)
        av = np.zeros_like(ak)
        lg = self.logits
        toks, why = [], "l"
        while len(toks) < max_tokens:
            t = int(np.argmax(lg))  # the first maximum, as ckv_model_argmax
            if t == end:
                why = "e"
                break
            toks.append(t)
            pos = self.n_done + len(toks) - 1  # where t's own K/V would go
            if t == stop:
                why = "s"
                break
            if len(toks) == max_tokens:
                break
            if pos >= m.seq_len:
                why = "c"
                break
            j = len(toks) - 1
            x = m.embed(t)
            for layer in range(m.n_layers):
                q, k, v = m.qkv(x, layer, pos)
                ak[layer, j] = k.to(torch.float16).numpy()
                av[layer, j] = v.to(torch.float16).numpy()
                out, mass = self.s.attention(layer, q, extra_k=ak[layer, :j + 1], extra_v=av[layer, :j + 1],
                                             cold_gather=COLD_GATHER)
                self.mass[:mass.size] += mass
                x = m.finish_layer(x, layer, torch.from_numpy(out).reshape(-1))
            lg = m.logits(x)
        return toks, why


# ---- running the dialogues --------------------------------------------------------


def run_dialogue(args, model: Llama, client, d: Dialogue, idx: int, bos: int, items: list) -> dict:
    t0 = time.monotonic()
    sid = f"{args.prefix}-{idx}"
    n_turns = d.turns_that_fit(model.seq_len)
    with client.open_session(sid, model.n_layers, model.n_kv_heads, model.head_dim, "fp16",
                             policy=args.policy, params=args.params or None, keep=args.keep) as s:
        w = Worker(model, s, args.sync)

        def feed(turn, start, stop):
            role = ROLES[turn[0]]
            data = Dialogue.rendering(turn)
            for i in range(start, stop):
                w.token(data[i], role, commitkv.Tag.TURN_START if i == 0 else commitkv.Tag.NONE)

        for t in range(n_turns):
            turn = d.turns[t]
            if t == 0:
                w.token(bos, commitkv.Role.SYSTEM, commitkv.Tag.TURN_START)
            if t in d.recall:
                question_turn, answer = d.recall[t]
                feed(turn, 0, 3)  # "A: "
                toks, why = w.decode_aside(MAX_ANSWER, NEWLINE, bos)
                said = bytes(x & 0xFF for x in toks)  # ids above 255 are not bytes, and never right
                ok = all(x < 256 for x in toks) and said == answer + b"\n"
                items.append({"dialogue": idx, "id": d.id, "turn": t, "question_turn": question_turn,
                              "kind": fact_kind(answer), "ok": ok, "said": said.decode("latin-1"),
                              "said_hex": said.hex(), "stop": {"s": "newline", "e": "bos", "c": "context"}.get(
                                  why, "length"),
                              "question": d.turns[question_turn][1].decode("latin-1"),
                              "expected": answer.decode("latin-1")})
                feed(turn, 3, len(Dialogue.rendering(turn)))  # the reference answer
            else:
                feed(turn, 0, len(Dialogue.rendering(turn)))
            w.end_round(t + 1)
    return {"session": sid, "id": d.id, "dialogue": idx, "tokens": w.n_done, "rounds": w.rounds,
            "steps": w.steps, "seconds": time.monotonic() - t0}


def parse_param(kv: str):
    name, eq, value = kv.partition("=")
    try:
        if not name or not eq:
            raise ValueError
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--param wants key=number, got {kv!r}") from None


def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG, description="Agent dialogues through a PyTorch model whose KV cache "
                                 "lives in commitkvd (the Python twin of commitkv-dialogue).")
    ap.add_argument("--dialogues", required=True, metavar="FILE.jsonl")
    ap.add_argument("--model", metavar="PATH", help="llama2.c legacy checkpoint (default: $CKV_MODEL, "
                    "$CKV_MODEL_DIR/" + DEFAULT_MODEL_FILE + ", ../shared/models/" + DEFAULT_MODEL_FILE + ")")
    ap.add_argument("--policy", metavar="NAME", help="the session's policy (default: the daemon's)")
    ap.add_argument("--param", action="append", type=parse_param, default=[], metavar="KEY=VALUE",
                    help="a per-session policy override (repeatable)")
    ap.add_argument("--limit", type=int, default=0, metavar="N", help="the first N dialogues of the file")
    ap.add_argument("--bos", type=int, default=-1, metavar="ID",
                    help="BOS id (default 256 for a vocabulary of 257, else 1)")
    ap.add_argument("--socket", metavar="EP", help="the daemon's endpoint (default $CKV_SOCKET)")
    ap.add_argument("--attach-socket", metavar="PATH", help="its attach socket (default $CKV_ATTACH_SOCKET)")
    ap.add_argument("--prefix", default=f"torch-{os.getpid()}", metavar="ID", help="session id prefix")
    ap.add_argument("--keep", action="store_true", help="close each session (the daemon keeps it) instead of "
                    "dropping it")
    ap.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads (default 1)")
    ap.add_argument("--sync", action="store_true", help="wait for each round's compressions before the next "
                    "token, as commitkv-dialogue --sync: runs repeat themselves")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    if args.limit < 0 or args.threads < 1 or args.bos < -1:
        ap.error("--limit, --threads and --bos take non-negative numbers")
    args.params = dict(args.param)
    return args


def model_path(args) -> str:
    if args.model:
        return args.model
    if os.environ.get("CKV_MODEL"):
        return os.environ["CKV_MODEL"]
    if os.environ.get("CKV_MODEL_DIR"):
        return os.path.join(os.environ["CKV_MODEL_DIR"], DEFAULT_MODEL_FILE)
    return os.path.join("..", "shared", "models", DEFAULT_MODEL_FILE)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    note = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    try:
        dialogues = load_dialogues(args.dialogues, args.limit)
        path = model_path(args)
        try:
            model = Llama(path)
        except OSError as e:
            raise Failure(f"cannot load model {path}: {e.strerror} (set --model, CKV_MODEL or CKV_MODEL_DIR)") \
                from None
        bos = args.bos if args.bos >= 0 else BOS_BYTE_MODEL if model.vocab == BOS_BYTE_MODEL + 1 else BOS_DEFAULT
        if model.vocab < 256 or bos >= model.vocab:
            raise BadInput(f"{path} is not a byte-level model: vocabulary {model.vocab}, BOS {bos}")
        items, sessions, skipped = [], [], 0
        try:
            client = commitkv.connect(args.socket, args.attach_socket, name=PROG)
        except commitkv.Error as e:
            raise Failure(f"cannot reach commitkvd ({args.socket or 'default socket'}): {e}") from None
        with client:
            if client.memory_kind != "host":
                raise Failure(f"the daemon's KV memory is '{client.memory_kind}', which the CPU cannot address: "
                              "run commitkvd --backend host")
            for i, d in enumerate(dialogues):
                if not d.turns_that_fit(model.seq_len):
                    note(f"{PROG}: {d.id}: its answers do not fit in {model.seq_len} positions: skipped")
                    skipped += 1
                    continue
                try:
                    sessions.append(run_dialogue(args, model, client, d, i, bos, items))
                except commitkv.Error as e:
                    raise Failure(f"{args.prefix}-{i} (dialogue {d.id}): {e}") from None
                x = sessions[-1]
                note(f"{d.id}: {x['tokens']} tokens, {x['rounds']} rounds, {x['seconds']:.2f}s")
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except Failure as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    correct = sum(it["ok"] for it in items)
    recall = correct / len(items) if items else 0.0
    if args.json:
        print(json.dumps({"model": path, "data": args.dialogues, "policy": args.policy or "default", "bos": bos,
                          "semantic": "none", "dialogues": len(sessions), "skipped": skipped,
                          "questions": len(items), "correct": correct, "recall": recall,
                          "steps": sum(x["steps"] for x in sessions), "items": items, "sessions": sessions},
                         ensure_ascii=True, separators=(",", ":")))
    else:
        print(f"{len(sessions)} dialogues of {args.dialogues} ({skipped} skipped), model {path}, "
              f"policy {args.policy or 'default'}")
        print(f"recall {recall:.4f} ({correct}/{len(items)})")
        for it in items:
            print(f"  {it['id']} turn {it['turn']}: {'ok ' if it['ok'] else 'no '} {it['said'].encode('latin-1')!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
