"""The GIL is released around kernels and blocking calls; a killed Python
worker leaks nothing in the daemon."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import commitkv

H, D = 8, 128


def fill(s, n, seed=0):
    rng = np.random.default_rng(seed)
    step = 512
    for first in range(0, n, step):
        p = s.append(step)
        s.write_kv(p, 0, rng.standard_normal((step, H, D)).astype(np.float16),
                   rng.standard_normal((step, H, D)).astype(np.float16))


def test_two_threads_attend_concurrently(client, sid):
    """Thread A runs a long kernel (512 query rows, some hundred ms); thread
    B starts a short one (1 row, about 100x shorter) once A is inside its
    call.  With the GIL released B finishes first; with the GIL held across
    A's kernel, B could not even enter its call before A returned."""
    with client.open_session(sid, 1, H, D) as s:
        fill(s, 4096)
        rng = np.random.default_rng(1)
        q_long = rng.standard_normal((512, H, D)).astype(np.float32)
        q_short = rng.standard_normal((1, H, D)).astype(np.float32)
        ref_short, _ = s.attention(0, q_short, threads=1)
        wins, trials = 0, []
        for _ in range(3):
            order, errors = [], []
            entering = threading.Event()

            def long_call():
                try:
                    entering.set()
                    s.attention(0, q_long, threads=1)
                    order.append("long")
                except Exception as e:  # reported below
                    errors.append(e)

            def short_call():
                try:
                    entering.wait()
                    time.sleep(0.03)
                    out, _ = s.attention(0, q_short, threads=1)
                    np.testing.assert_array_equal(out, ref_short)  # same bits for the same view
                    order.append("short")
                except Exception as e:
                    errors.append(e)

            ts = [threading.Thread(target=long_call), threading.Thread(target=short_call)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert not errors, errors
            trials.append((order, round(time.perf_counter() - t0, 3)))
            wins += order[0] == "short"
        assert wins >= 2, f"the short kernel never overtook the long one (the GIL was held): {trials}"


def test_a_python_thread_runs_while_a_kernel_runs(client, sid):
    """While the main thread is inside a long attention call, a pure-Python
    thread keeps running: its longest pause stays far below the call's
    length (with the GIL held it would pause for the whole call)."""
    with client.open_session(sid, 1, H, D) as s:
        fill(s, 4096, seed=2)
        q = np.random.default_rng(3).standard_normal((512, H, D)).astype(np.float32)
        gap = [0.0]
        done = threading.Event()

        def spin():
            last = time.perf_counter()
            while not done.is_set():
                now = time.perf_counter()
                gap[0] = max(gap[0], now - last)
                last = now

        t = threading.Thread(target=spin)
        old = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        try:
            t.start()
            time.sleep(0.02)
            gap[0] = 0.0
            a = time.perf_counter()
            s.attention(0, q, threads=1)
            call = time.perf_counter() - a
            time.sleep(0.005)
        finally:
            done.set()
            t.join()
            sys.setswitchinterval(old)
        assert gap[0] < 0.5 * call, f"a Python thread paused {gap[0] * 1e3:.0f} ms during a {call * 1e3:.0f} ms kernel"


def test_acks_wait_for_kernels_in_flight(client, sid):
    """ack() and attention() from two threads at once: every result finite, no crash."""
    with client.open_session(sid, 1, 4, 64) as s:
        rng = np.random.default_rng(4)
        stop = threading.Event()
        errors = []

        def attend():
            q = rng.standard_normal((4, 64)).astype(np.float32)
            while not stop.is_set():
                try:
                    out, _ = s.attention(0, q)
                    assert np.isfinite(out).all()
                except Exception as e:
                    errors.append(e)
                    return

        t = threading.Thread(target=attend)
        t.start()
        try:
            for rnd in range(1, 30):
                p = s.append(16, semantic=0.9 if rnd % 3 == 0 else 0.0)
                s.write_kv(p, 0, rng.standard_normal((16, 4, 64)).astype(np.float16),
                           rng.standard_normal((16, 4, 64)).astype(np.float16))
                mass = np.zeros(s.tokens, np.float32)
                mass[-16:] = 1.0
                s.ack(s.report(rnd, mass).epoch)
        finally:
            stop.set()
            t.join()
        assert not errors, errors


VICTIM = r"""
import sys, time, numpy as np, commitkv
c = commitkv.connect(sys.argv[1], sys.argv[2])
s = c.open_session("victim", 2, 4, 64)
p = s.append(48, roles="user")
for layer in range(2):
    s.write_kv(p, layer, np.ones((48, 4, 64), np.float16), np.ones((48, 4, 64), np.float16))
view = s.view()             # arrays over the arena, held
out, mass = s.attention(0, np.ones((4, 64), np.float32))
s.report(1, mass)
print("ready", flush=True)
time.sleep(600)
"""


def wait_for(fn, what, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout} s")


def test_killed_python_worker_leaks_nothing(make_daemon):
    d = make_daemon(["--set", "daemon.lease=3s", "--set", "daemon.heartbeat=500ms", "--set", "daemon.detach_keep=2s"])
    base = d.stats()
    assert base["arenas"][0]["bytes_used"] == 0
    env = dict(os.environ)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, d.socket, d.attach], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = victim.stdout.readline()
        assert line.strip() == "ready", line + victim.stderr.read()
        held = d.stats()
        assert held["sessions"] == 1 and held["tokens"]["draft"] + held["tokens"]["staged"] >= 48
        assert held["arenas"][0]["bytes_used"] > 0
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    # detached at once (its attach socket closed), freed after detach_keep
    wait_for(lambda: d.stats()["sessions_detached"] >= 1, "the dead worker's session was never detached")
    wait_for(lambda: d.stats()["sessions_expired"] >= 1, "the detached session was never freed")
    end = d.stats()
    assert end["sessions"] == 0 and end["detached_sessions"] == 0
    assert end["clients"] == base["clients"], end  # only commitkvctl's own, as before the worker
    assert end["arenas"][0]["bytes_used"] == 0, "the killed worker's bytes never returned to the arena"
    assert end["tokens"]["draft"] == end["tokens"]["staged"] == end["tokens"]["committed"] == 0
    assert d.alive()
    # and the daemon serves the next worker
    with commitkv.connect(d.socket, d.attach) as c:
        with c.open_session("victim", 2, 4, 64) as s:
            assert s.tokens == 0


def test_close_while_other_threads_call(daemon, sid):
    """close() from one thread while others are inside stats() and
    attention(): they finish or get a clear error (Disconnected, StateError),
    never a crash."""
    c = commitkv.connect(daemon.socket, daemon.attach)
    s = c.open_session(sid, 1, 4, 64)
    p = s.append(64)
    s.write_kv(p, 0, np.ones((64, 4, 64), np.float16), np.ones((64, 4, 64), np.float16))
    q = np.ones((4, 64), np.float32)
    seen, go = set(), threading.Event()

    def hammer(call):
        go.wait()
        end = time.monotonic() + 60
        while time.monotonic() < end:  # until close() shows
            try:
                call()
            except (commitkv.Disconnected, commitkv.StateError) as e:
                seen.add(type(e).__name__)
                return

    ts = [threading.Thread(target=hammer, args=(c.stats,)), threading.Thread(target=hammer, args=(c.heartbeat,)),
          threading.Thread(target=hammer, args=(lambda: s.attention(0, q),))]
    for t in ts:
        t.start()
    go.set()
    time.sleep(0.05)
    c.close()
    for t in ts:
        t.join(60)
    assert seen == {"Disconnected", "StateError"}, seen
    assert s.closed and c.closed
