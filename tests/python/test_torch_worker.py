"""examples/torch_worker.py (PyTorch, KV cache in commitkvd through the
module) against commitkv-dialogue (C) on the same public agent dialogues,
with the real model stories260K on a real commitkvd.

stories260K is no byte-level model (vocabulary 512, BOS 1), but bytes are
valid token ids for it: its answers are nonsense, and deterministic, which is
what an equivalence test needs.  --limit 3 of the public file runs one
dialogue (d002; the others do not fit in its 512 positions): 3 questions,
507 appended tokens, 312 decoded ones.  Both workers send no semantic scores
(commitkv-dialogue --semantic none), so the daemon sees the same protocol.

- fp16: every answer is the same bytes, and the K/V both workers wrote into
  the daemon (kept with --keep, read back through a resumed session's view)
  are the same bits at every position and layer: the torch forward pass sums
  in model.c's order.
- commitkv: the daemon compresses from the reported mass; both workers
  decode answers aside the same way (the decoded tokens' K/V in a private
  draft block after the view's: Session.attention's extra_k / extra_v), and
  with --sync both wait for each round's moves (Session.settle), so they see
  the same states and say the same bytes.  Measured on every dialogue of the
  file that fits (31, 54 answers): 54 identical, with and without --sync
  (with the earlier per-head normaliser decode: 35 and 37).

Skipped, visibly, without torch, without the model or the dialogues."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BIN_DIR, ROOT, daemon_env

LIMIT = "3"
TIMEOUT_S = 300


def shared_file(name, env_file=None):
    """A file of ../shared/models, found as the C tests find the model."""
    if env_file and os.environ.get(env_file):
        return os.environ[env_file]
    d = os.environ.get("CKV_MODEL_DIR") or os.path.join(os.environ.get("CKV_SOURCE_DIR", ROOT), "..", "shared",
                                                        "models")
    return os.path.join(d, name)


MODEL = shared_file("stories260K.bin", "CKV_MODEL")
DIALOGUES = shared_file("agent-dialogues.jsonl")


@pytest.fixture(scope="module")
def needs():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (Debian python3-torch)")
    if not os.path.exists(MODEL):
        pytest.skip(f"model not found at {MODEL} (set CKV_MODEL or CKV_MODEL_DIR)")
    if not os.path.exists(DIALOGUES):
        pytest.skip(f"dialogues not found at {DIALOGUES}")
    if not os.access(os.path.join(BIN_DIR, "commitkv-dialogue"), os.X_OK):
        pytest.skip(f"commitkv-dialogue not built in {BIN_DIR}")


def run(argv, what, env):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert out.returncode == 0, f"{what} failed ({out.returncode}):\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def both(daemon, policy, *extra):
    common = ["--socket", daemon.socket, "--attach-socket", daemon.attach, "--model", MODEL, "--dialogues",
              DIALOGUES, "--limit", LIMIT, "--bos", "1", "--policy", policy, "--json", "--quiet", *extra]
    c = run([os.path.join(BIN_DIR, "commitkv-dialogue"), *common, "--semantic", "none", "--prefix", f"c-{policy}"],
            f"commitkv-dialogue --policy {policy}", daemon_env())  # a sanitizer build keeps its leak checks
    t = run([sys.executable, os.path.join(ROOT, "examples", "torch_worker.py"), *common, "--prefix",
             f"t-{policy}"], f"torch_worker.py --policy {policy}", dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    return c, t


def same_answers(c, t):
    assert c["questions"] >= 3 and c["dialogues"] == t["dialogues"] and c["questions"] == t["questions"], \
        f"C: {c['dialogues']} dialogues, {c['questions']} questions; torch: {t['dialogues']}, {t['questions']}"
    for a, b in zip(c["items"], t["items"]):
        where = f"{a['id']} turn {a['turn']}"
        assert (a["id"], a["turn"]) == (b["id"], b["turn"]), f"{where}: the torch worker answered {b['id']} " \
                                                             f"turn {b['turn']}"
        assert b["said_hex"] == a["said_hex"] and b["stop"] == a["stop"], \
            f"{where}: C said {bytes.fromhex(a['said_hex'])[:60]!r}... ({a['stop']}), " \
            f"torch {bytes.fromhex(b['said_hex'])[:60]!r}... ({b['stop']})"
        assert b["ok"] == a["ok"], where
    assert t["correct"] == c["correct"]


def kept_kv(client, sid):
    """K and V bits of every position and layer of a kept session (fp16: all draft), dropped after."""
    s = client.open_session(sid, None, None, None, resume=True)
    try:
        v, n, layers = s.view(), s.tokens, s.geometry.n_layers
        kv = np.stack([np.stack([np.stack(v.kv(p, layer)) for layer in range(layers)]) for p in range(n)])
        return kv.view(np.uint16).copy()
    finally:
        s.drop()


def test_fp16_answers_and_kv_equal_the_c_workers(needs, daemon, client):
    c, t = both(daemon, "fp16", "--keep")
    assert c["policy"] == "fp16"
    same_answers(c, t)
    for a, b in zip(c["sessions"], t["sessions"]):
        kc, kt = kept_kv(client, a["session"]), kept_kv(client, b["session"])
        assert kc.shape == kt.shape and kc.shape[0] == a["tokens"], (kc.shape, kt.shape)
        diff = np.argwhere(kc != kt)
        assert diff.size == 0, f"{a['id']}: {len(diff)} K/V elements differ, the first at (position, layer, " \
                               f"k|v, head, dim) {tuple(diff[0])}"


def test_commitkv_answers_equal_the_c_workers(needs, daemon):
    c, t = both(daemon, "commitkv", "--sync")
    assert c["policy"] == "commitkv"
    assert c["bytes_ratio_fp16"] < 0.9, f"commitkv compressed nothing ({c['bytes_ratio_fp16']} of FP16)"
    same_answers(c, t)
