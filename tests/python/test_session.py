"""Every call of commitkv against a real commitkvd: connect, sessions, append,
write_kv, zero-copy views, attention, report, ack, stats."""

import json
import os
import time

import numpy as np
import pytest

import commitkv

L, H, D = 2, 4, 64


def rand_kv(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, H, D)).astype(np.float16), rng.standard_normal((n, H, D)).astype(np.float16))


def test_connect_by_arguments_and_by_environment(daemon, monkeypatch):
    with commitkv.connect(daemon.socket, daemon.attach, heartbeat=False) as c:
        assert c.tenant and c.memory_kind == "host" and c.lease_ms > 0 and not c.restarted
        c.heartbeat()
    assert c.closed
    monkeypatch.setenv("CKV_SOCKET", daemon.socket)
    monkeypatch.setenv("CKV_ATTACH_SOCKET", daemon.attach)
    with commitkv.connect() as c:
        assert c.stats()["clients"] >= 1
    with pytest.raises(commitkv.Disconnected, match="closed"):
        c.stats()


def test_open_append_write_view_zero_copy(client, sid):
    with client.open_session(sid, L, H, D) as s:
        assert s.geometry == commitkv.Geometry(L, H, D, "fp16") and s.id == sid and s.tokens == 0
        first = s.append(5, roles="user", tags=[commitkv.Tag.TURN_START, 0, 0, commitkv.Tag.SENTENCE_START, 0],
                         semantic=0.25, token_ids=[10, 11, 12, 13, 14])
        assert first == 0 and s.tokens == 5
        k, v = rand_kv(5)
        for layer in range(L):
            assert s.write_kv(first, layer, k, v) == 5
        view = s.view()
        assert view.n_tokens == 5 and len(view.draft) >= 1 and not view.staged and not view.committed
        for pos in range(5):
            blk, slot = view.locate(pos)
            assert blk.category == "draft" and blk.format == "draft"
            assert blk.positions[slot] == pos and blk.valid[slot]
            for layer in range(L):
                kk, vv = view.kv(pos, layer)
                assert kk.dtype == np.float16 and kk.shape == (H, D)
                np.testing.assert_array_equal(kk, k[pos])
                np.testing.assert_array_equal(vv, v[pos])
        # read-only, and over the arena: neither numpy nor the buffer lets a write through
        blk, slot = view.locate(2)
        for a in (blk.data, blk.positions, blk.k, blk.v):
            assert not a.flags.writeable and not a.flags.owndata
            with pytest.raises(ValueError):
                a.flat[0] = 0
        with pytest.raises((BufferError, TypeError)):
            memoryview(blk._buffer).cast("B")[0] = 1
        # zero copy: a later write_kv shows in the arrays already held, same epoch, no new view
        before = blk.k[1, slot].copy()
        k2 = (-k[2]).astype(np.float16)
        s.write_kv(2, 1, k2, None)
        np.testing.assert_array_equal(blk.k[1, slot], k2)
        assert not np.array_equal(before, k2)
        np.testing.assert_array_equal(blk.v[1, slot], v[2])  # v=None left V alone
        # the array's memory is the block's memory in the mapped arena
        addr = blk.k.__array_interface__["data"][0]
        base = blk._buffer.address()
        assert base <= addr < base + blk.nbytes
        assert blk.k.ctypes.data == blk.data.ctypes.data + (blk.k.ctypes.data - base)


def test_write_kv_accepts_any_buffer_and_one_token(client, sid):
    with client.open_session(sid, L, H, D) as s:
        s.append(2)
        k, v = rand_kv(2, seed=1)
        s.write_kv(0, 0, k[0], v[0])  # (H, D)
        s.write_kv(1, 0, memoryview(k[1].reshape(-1)), memoryview(v[1].reshape(-1)))  # flat (H*D,) memoryviews
        view = s.view()
        for pos in range(2):
            kk, vv = view.kv(pos, 0)
            np.testing.assert_array_equal(kk, k[pos])
            np.testing.assert_array_equal(vv, v[pos])


@pytest.mark.parametrize("bad, message", [
    (np.zeros((H, D), np.float32), "wrong dtype"),
    (np.zeros((H, D), np.float64), "wrong dtype"),
    (np.zeros((H, D), np.int16), "wrong dtype"),
    (np.zeros((H, D + 1), np.float16), "wrong shape"),
    (np.zeros((H + 1, D), np.float16), "wrong shape"),
    (np.zeros((2, 2, H, D), np.float16), "wrong shape"),
    (np.zeros((H, 2 * D), np.float16)[:, ::2], "C-contiguous"),
    ([[0.0] * D] * H, "an array"),
    ("kv", "wrong dtype|an array"),
])
def test_write_kv_refuses_wrong_dtype_or_shape_clearly(client, sid, bad, message):
    with client.open_session(sid, L, H, D) as s:
        s.append(1)
        good = np.zeros((H, D), np.float16)
        with pytest.raises(ValueError, match=message) as e:
            s.write_kv(0, 0, bad, good)
        assert "float16" in str(e.value) or "C-contiguous" in str(e.value)
        with pytest.raises(ValueError, match=message):
            s.write_kv(0, 0, good, bad)
        s.write_kv(0, 0, good, good)  # the session lives on


def test_write_kv_token_count_mismatch(client, sid):
    with client.open_session(sid, L, H, D) as s:
        s.append(3)
        k, v = rand_kv(3)
        with pytest.raises(ValueError, match="k holds 3 tokens, v 2"):
            s.write_kv(0, 0, k, v[:2])


def test_bf16_session_takes_uint16_bits(client, sid):
    with client.open_session(sid, 1, H, D, dtype="bf16") as s:
        assert s.geometry.dtype == "bf16"
        s.append(1)
        bits = (np.arange(H * D, dtype=np.uint32) % 300 + 0x3F00).astype(np.uint16).reshape(H, D)
        s.write_kv(0, 0, bits, bits)
        with pytest.raises(ValueError, match="bfloat16"):
            s.write_kv(0, 0, bits.astype(np.float16), None)
        kk, _ = s.view().kv(0, 0)
        assert kk.dtype == np.uint16
        np.testing.assert_array_equal(kk, bits)


def reference_attention(k, v, q, scale):
    """softmax(q K^T * scale) V per query head (GQA: head h reads kv head h // group)."""
    group = q.shape[0] // k.shape[1]
    out = np.zeros(q.shape, np.float64)
    mass = np.zeros(k.shape[0], np.float64)
    for h in range(q.shape[0]):
        kh = k[:, h // group].astype(np.float64)
        vh = v[:, h // group].astype(np.float64)
        s = kh @ q[h].astype(np.float64) * scale
        p = np.exp(s - s.max())
        p /= p.sum()
        out[h] = p @ vh
        mass += p
    return out, mass


def test_attention_matches_numpy_and_feeds_report(client, sid):
    with client.open_session(sid, L, H, D) as s:
        n = 40  # more than one draft block
        s.append(n, roles=commitkv.Role.USER)
        k, v = rand_kv(n, seed=3)
        for layer in range(L):
            s.write_kv(0, layer, k * (layer + 1), v)
        rng = np.random.default_rng(4)
        q = rng.standard_normal((2 * H, D)).astype(np.float32)  # grouped-query: 2 query heads per kv head
        out, mass = s.attention(1, q)
        assert out.shape == q.shape and out.dtype == np.float32 and mass.shape == (n,)
        ref_out, ref_mass = reference_attention((k * 2).astype(np.float16), v, q, 1 / np.sqrt(D))
        np.testing.assert_allclose(out, ref_out, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(mass, ref_mass, rtol=2e-3, atol=2e-4)
        assert mass.sum() == pytest.approx(2 * H, rel=1e-4)
        out2, _ = s.attention(1, q, scale=0.5)
        ref2, _ = reference_attention((k * 2).astype(np.float16), v, q, 0.5)
        np.testing.assert_allclose(out2, ref2, rtol=2e-3, atol=2e-3)
        rows = np.stack([q, -q])
        out3, mass3 = s.attention(0, rows)
        assert out3.shape == (2, 2 * H, D) and mass3.sum() == pytest.approx(4 * H, rel=1e-4)
        result = s.report(1, mass, semantic={0: 0.9, 1: 0.1})
        assert isinstance(result, commitkv.RoundResult) and result.epoch >= 1
        assert isinstance(result.transitions, list)
        assert s.ack(result.epoch) >= 0
        with pytest.raises(ValueError, match="q: wrong shape"):
            s.attention(0, np.zeros((H + 1, D), np.float32))
        with pytest.raises(commitkv.OutOfRange, match="layer 2"):
            s.attention(L, q)


def test_attention_over_extra_tokens_equals_appending_them(client, sid):
    """extra_k / extra_v (decoding aside): attending over the view plus m
    tokens the session does not hold gives what appending them gives, and the
    session's mass leaves the extra tokens out."""
    with client.open_session(sid, L, H, D) as s:
        n, m = 40, 5
        s.append(n, roles=commitkv.Role.USER)
        k, v = rand_kv(n + m, seed=8)
        for layer in range(L):
            s.write_kv(0, layer, k[:n] * (layer + 1), v[:n])
        rng = np.random.default_rng(9)
        q = rng.standard_normal((2 * H, D)).astype(np.float32)
        ek, ev = (k[n:] * 2).astype(np.float16), v[n:].astype(np.float16)
        out, mass = s.attention(1, q, extra_k=ek, extra_v=ev)
        assert mass.shape == (n,)
        ref_out, ref_mass = reference_attention((k * 2).astype(np.float16), v, q, 1 / np.sqrt(D))
        np.testing.assert_allclose(out, ref_out, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(mass, ref_mass[:n], rtol=2e-3, atol=2e-4)
        assert mass.sum() < 2 * H * (1 - 1e-3)  # the extra tokens took their share
        # the same tokens appended: the same output up to summation order
        s.append(m, roles=commitkv.Role.USER)
        for layer in range(L):
            s.write_kv(n, layer, k[n:] * (layer + 1), v[n:])
        out2, mass2 = s.attention(1, q)
        np.testing.assert_allclose(out, out2, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mass, mass2[:n], rtol=1e-5, atol=1e-7)
        with pytest.raises(ValueError, match="go together"):
            s.attention(1, q, extra_k=ek)
        with pytest.raises(ValueError, match="extra_k, extra_v"):
            s.attention(1, q, extra_k=ek[:, :, :-1], extra_v=ev[:, :, :-1])


def test_rounds_move_tokens_and_views_follow(client, sid):
    """Rounds with attention on some tokens and none on others: the daemon
    publishes transitions (draft -> staged/committed/recycled), the view's
    epoch moves, and attention reads every format in place."""
    params = {"sink_tokens": 0, "recent_window": 8}
    with client.open_session(sid, L, H, D, params=params) as s:
        seen, epoch = set(), 0
        rng = np.random.default_rng(5)
        q = rng.standard_normal((H, D)).astype(np.float32)
        for rnd in range(1, 25):
            first = s.append(16, roles="user" if rnd % 2 else "assistant", semantic=0.9 if rnd < 3 else 0.05)
            k, v = rand_kv(16, seed=rnd)
            for layer in range(L):
                s.write_kv(first, layer, k, v)
            out, mass = s.attention(0, q)
            assert np.isfinite(out).all() and mass.shape == (s.tokens,)
            mass[:32] += 1.0  # the first tokens matter every round
            r = s.report(rnd, mass)
            for t in r.transitions:
                assert isinstance(t.from_state, commitkv.State) and t.count > 0
                seen.add((t.from_state, t.to_state))
            s.ack(r.epoch)
            epoch = max(epoch, r.epoch)
        view = s.view()
        assert view.epoch == s.epoch >= epoch > 1
        assert seen, "24 rounds published no transition"
        assert view.staged or view.committed, f"nothing left draft: {seen}"
        for b in view.staged + view.committed + view.cold:
            assert b.k is None and b.format != "draft" and b.data.size == b.nbytes
        out, mass = s.attention(0, q)
        assert np.isfinite(out).all()
        # demotion is the default: the filler's bytes stay, in cold blocks the view lists apart
        assert view.cold, f"nothing demoted to a cold block: {view}"
        cold_positions = {int(p) for b in view.cold for p in b.positions[b.valid]}
        # a uniform query (all zeros) could need every cold block: uncapped (0), attention
        # reads them all and gives their tokens mass; capped at 1, one block
        zq = np.zeros((H, D), dtype=np.float32)
        _, mass_all = s.attention(0, zq, cold_max_blocks=0)
        _, mass_one = s.attention(0, zq, cold_max_blocks=1)
        read_all = {p for p in cold_positions if mass_all[p] > 0}
        read_one = {p for p in cold_positions if mass_one[p] > 0}
        assert read_all == cold_positions, f"{len(cold_positions - read_all)} cold tokens unread uncapped"
        assert read_one and len(read_one) < len(read_all) or len(view.cold) == 1
        # cold_gather: the cold tier read per token, as the C worker does: exactly that many cold
        # tokens get mass; gathering every one gives what reading every cold block gives (their
        # K/V as FP16 copies); two rows gather each their own; more than a block's tokens refused
        s.settle()  # moves still running would change the view between the calls compared here
        view = s.view()
        cold_positions = {int(p) for b in view.cold for p in b.positions[b.valid]}
        _, mass_all = s.attention(0, zq, cold_max_blocks=0)
        n_cold = len(cold_positions)
        assert n_cold > 4
        _, mass_g = s.attention(0, zq, cold_gather=4)
        assert len({p for p in cold_positions if mass_g[p] > 0}) == 4
        out_blocks, mass_blocks = s.attention(0, q, cold_max_blocks=0)
        out_gather, mass_gather = s.attention(0, q, cold_gather=n_cold)
        np.testing.assert_allclose(out_gather, out_blocks, rtol=1e-2, atol=2e-3)
        np.testing.assert_allclose(mass_gather, mass_blocks, rtol=1e-2, atol=1e-4)
        out2, mass2 = s.attention(0, np.stack([q, zq]), cold_gather=n_cold)
        np.testing.assert_allclose(out2[0], out_blocks, rtol=1e-2, atol=2e-3)
        np.testing.assert_allclose(mass2, mass_blocks + mass_all, rtol=1e-2, atol=1e-4)
        with pytest.raises(ValueError, match="cold_gather"):
            s.attention(0, zq, cold_gather=1 << 20)
        with pytest.raises(ValueError, match="fewer rows"):  # 4096 rows of 1024-token blocks: GiBs
            s.attention(0, np.zeros((4096, H, D), dtype=np.float32), cold_gather=1024)


def test_session_close_keep_detaches_and_resume_finds_it(client, sid):
    with client.open_session(sid, L, H, D, keep=True) as s:
        s.append(3)
        k, v = rand_kv(3)
        s.write_kv(0, 0, k, v)
    assert s.closed
    with pytest.raises(commitkv.StateError, match="closed"):
        s.append(1)
    with client.open_session(sid, None, None, None, resume=True) as r:
        assert r.tokens == 3 and r.geometry == commitkv.Geometry(L, H, D, "fp16")
        kk, _ = r.view().kv(1, 0)
        np.testing.assert_array_equal(kk, k[1])
    # left without keep: dropped, so there is nothing to resume
    with pytest.raises(commitkv.NotFound):
        client.open_session(sid, None, None, None, resume=True)


def test_client_close_detaches_open_sessions_but_keeps_views_mapped(daemon, sid):
    c = commitkv.connect(daemon.socket, daemon.attach)
    s = c.open_session(sid, L, H, D)
    s.append(2)
    k, v = rand_kv(2)
    s.write_kv(0, 0, k, v)
    kk, _ = s.view().kv(1, 0)
    c.close()
    assert s.closed and c.closed
    np.testing.assert_array_equal(kk, k[1])  # still mapped: the array holds the arena
    del kk
    with commitkv.connect(daemon.socket, daemon.attach) as c2:
        with c2.open_session(sid, None, None, None, resume=True) as r:  # detached, not dropped
            assert r.tokens == 2


def test_stats_is_the_stats_json_object(client, daemon, sid):
    with client.open_session(sid, L, H, D) as s:
        s.append(4)
        mine = client.stats()
        ctl = daemon.stats()
    assert set(mine) == set(ctl)
    for key in ("tokens", "bytes"):
        assert set(mine[key]) == set(ctl[key])
    assert [set(a) for a in mine["arenas"]] == [set(a) for a in ctl["arenas"]]
    assert [set(t) for t in mine["tenants"]] == [set(t) for t in ctl["tenants"]]
    assert [set(t) for t in mine["tiers"]] == [set(t) for t in ctl["tiers"]]
    assert mine["sessions"] >= 1 and mine["tokens"]["draft"] >= 4 and mine["backend"] == ctl["backend"]
    assert json.loads(json.dumps(mine)) == mine


def test_prefetch_brings_an_offloaded_session_back_without_waiting(make_daemon, sid):
    d = make_daemon(extra=["--set", "daemon.disk_idle=1s", "--set", "daemon.disk_memory=64M"])
    with commitkv.connect(d.socket, d.attach) as c:
        with c.open_session(sid, L, H, D) as s:
            s.append(3)
            k, v = rand_kv(3)
            s.write_kv(0, 0, k, v)
            s.report(1, np.ones(3, dtype=np.float32))
            assert s.prefetch() is True  # in memory
            end = time.monotonic() + 20
            while d.stats()["tiers"][1]["sessions"] != 1:
                assert time.monotonic() < end, d.log_tail()
                time.sleep(0.05)
            assert s.prefetch() is False  # on disk: the answer does not wait for the read
            while not s.prefetch():
                assert time.monotonic() < end, d.log_tail()
                time.sleep(0.02)
            assert d.stats()["tiers"][1]["restores"] == 1
            kk, vv = s.view().kv(1, 0)
            np.testing.assert_array_equal(kk, k[1])
            np.testing.assert_array_equal(vv, v[1])
