"""Shared prefixes from Python (issue 41): client.lookup_prefix,
open_session(token_ids=..., reuse_prefix=True), session.fork."""
import numpy as np
import pytest

import commitkv

L, H, D = 2, 2, 16


def kv(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, L, H, D)).astype(np.float16),
            rng.standard_normal((n, L, H, D)).astype(np.float16))


def fill(s, first, ids, k, v, round_):
    pos = s.append(len(ids), token_ids=ids)
    assert pos == first
    for layer in range(L):
        s.write_kv(first, layer, np.ascontiguousarray(k[:, layer]), np.ascontiguousarray(v[:, layer]))
    s.report(round_, np.ones(s.tokens, dtype=np.float32))


def test_reuse_prefix_and_fork(client, sid):
    ids = np.arange(5000, 5000 + 70, dtype=np.uint32)
    k, v = kv(70, 1)
    with client.open_session(sid + "-a", L, H, D, policy="fp16", model_id="m") as a:
        fill(a, 0, ids, k, v, 1)
        # whole 16-token blocks only: 64 of 70
        assert client.lookup_prefix(ids, model_id="m") == 64
        assert client.lookup_prefix(ids, model_id="other") == 0
        assert client.lookup_prefix(list(ids[:20]), model_id="m") == 16
        with client.open_session(sid + "-b", L, H, D, policy="fp16", model_id="m", token_ids=ids,
                                 reuse_prefix=True) as b:
            assert b.matched_tokens == 64 and b.tokens == 64
            view = b.view()
            for pos in (0, 17, 63):
                kk, vv = view.kv(pos, 1)
                np.testing.assert_array_equal(kk, k[pos, 1])
                np.testing.assert_array_equal(vv, v[pos, 1])
            st = client.stats()
            t = st["tenants"][0]
            assert t["tokens"]["shared"] == 128
            assert t["bytes"]["shared"] > 0 and t["dedup_ratio"] > 1.0
        with a.fork(sid + "-c", at=40) as c:
            assert c.matched_tokens == 32 and c.tokens == 40
            view = c.view()
            for pos in (5, 33, 39):
                kk, _ = view.kv(pos, 0)
                np.testing.assert_array_equal(kk, k[pos, 0])
            with pytest.raises(commitkv.AlreadyExists):
                a.fork(sid + "-c", at=16)
        with a.fork(sid + "-d") as d:  # at=None: all it reported
            assert d.tokens == 70 and d.matched_tokens == 64
    with pytest.raises(ValueError):
        client.lookup_prefix(np.zeros((2, 2), dtype=np.uint32))
