"""data.py - dialogues (gen.py's schema) to token ids and loss weights.

A sample is BOS then the rendered bytes (b"R: text\\n" per turn), cut at
seq_len + 1 tokens and padded; the model reads ids[:-1] and predicts ids[1:].
Each target byte's loss weight is 1, answer_weight for the bytes of a recall
answer (its text after "A: " and the newline that ends it), and 0 for padding.
Recall answers also get their spans recorded so the evaluator can score exact
match in one teacher-forced pass: greedy decoding after "A: " reproduces
answer + "\\n" exactly when the model's argmax at each of those positions, given
the right bytes before it, is the right byte.
"""
import json

from model import BOS


def render_spans(d):
    """(bytes after BOS, [(start, end, recall entry)]) with start..end the
    positions (in the BOS-prefixed sequence) of answer + newline."""
    out = bytearray()
    starts = {}
    for i, t in enumerate(d["turns"]):
        prefix = ("%s: " % t["role"]).encode()
        starts[i] = 1 + len(out) + len(prefix)  # +1 for BOS
        out += prefix + t["text"].encode() + b"\n"
    spans = []
    for r in d["recall"]:
        s = starts[r["turn"]]
        spans.append((s, s + len(r["answer"].encode()) + 1, r))
    return bytes(out), spans


def fact_offset(d, r):
    """Position (BOS-prefixed) of the last earlier occurrence of the answer's
    sentence before the answer turn, i.e. where the fact was stated; None if
    it was never stated."""
    out = bytearray(b"\x00")
    best = None
    ans = r["answer"].encode()
    for i, t in enumerate(d["turns"]):
        if i == r["turn"]:
            break
        line = ("%s: %s\n" % (t["role"], t["text"])).encode()
        k = line.rfind(ans)
        if k >= 0 and not (t["role"] == "A" and t["text"] == r["answer"]):
            best = len(out) + k
        out += line
    return best


def value_start(answer):
    """Bytes of the fixed sentence form before the fact's value ("The passenger
    is " of "The passenger is Dmitri Silva."), 0 when the form is unknown."""
    from gen import KINDS
    for p, _ in KINDS:
        if answer.startswith(p):
            return len(p.encode())
    return 0


def encode(d, seq_len, answer_weight, value_weight=None):
    """ids (seq_len+1 ints), weights (seq_len floats, one per target), n_tokens.
    With value_weight, the bytes of an answer from its fact's value on (value,
    full stop, newline: where the model has to copy) weigh value_weight."""
    body, spans = render_spans(d)
    ids = [BOS] + list(body)
    ids = ids[: seq_len + 1]
    n = len(ids)
    w = [1.0] * (n - 1)
    for s, e, r in spans:
        v = s + value_start(r["answer"]) if value_weight is not None else e
        for p in range(s, min(e, n)):
            # target at position p is predicted from p-1
            w[p - 1] = value_weight if p >= v and v > s else answer_weight
    pad = seq_len + 1 - n
    return ids + [0] * pad, w + [0.0] * pad, n


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
