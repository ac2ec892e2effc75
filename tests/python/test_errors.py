"""Each common error class raised by a real daemon, with its status and the daemon's text."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import commitkv

L, H, D = 2, 4, 64


def check(excinfo, cls, name, words):
    e = excinfo.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert isinstance(e, commitkv.Error)
    assert e.status.name == name and e.code == int(commitkv.Status[name]) < 0
    assert words in e.text, e.text
    assert name in str(e)


def test_already_exists_not_found_busy_format_invalid(daemon, client, sid):
    with client.open_session(sid, L, H, D, keep=True):
        with pytest.raises(commitkv.Error) as ei:
            client.open_session(sid, L, H, D)
        check(ei, commitkv.AlreadyExists, "CKV_ERR_EXISTS", sid)
        with commitkv.connect(daemon.socket, daemon.attach) as other:
            with pytest.raises(commitkv.Error) as ei:
                other.open_session(sid, None, None, None, resume=True)
            check(ei, commitkv.Busy, "CKV_ERR_BUSY", "attached to another client")
    with pytest.raises(commitkv.Error) as ei:
        client.open_session(sid, L, H, D + 64, resume=True)
    check(ei, commitkv.FormatMismatch, "CKV_ERR_FORMAT", "another geometry")
    with pytest.raises(commitkv.Error) as ei:
        client.open_session(sid + "-none", None, None, None, resume=True)
    check(ei, commitkv.NotFound, "CKV_ERR_NOT_FOUND", "no session")
    with pytest.raises(commitkv.InvalidArgument) as ei:
        client.open_session("bad id with spaces", L, H, D)
    assert isinstance(ei.value, ValueError) and ei.value.status.name == "CKV_ERR_INVALID"
    client.open_session(sid, None, None, None, resume=True).drop()


def test_limit_range_state_invalid_round(client, sid):
    with pytest.raises(commitkv.Error) as ei:
        client.open_session(sid, 100000, H, D)
    check(ei, commitkv.LimitExceeded, "CKV_ERR_LIMIT", "")
    with client.open_session(sid, L, H, D) as s:
        s.append(1)
        kv = np.zeros((H, D), np.float16)
        with pytest.raises(commitkv.OutOfRange) as ei:
            s.write_kv(5, 0, kv, kv)
        check(ei, commitkv.OutOfRange, "CKV_ERR_RANGE", "no writable draft slot for position 5")
        with pytest.raises(commitkv.OutOfRange):
            s.write_kv(0, L, kv, kv)
        with pytest.raises(commitkv.Error) as ei:
            s.report(0, np.zeros(1, np.float32))
        check(ei, commitkv.InvalidArgument, "CKV_ERR_INVALID", "rounds start at 1")
    with pytest.raises(commitkv.Error) as ei:
        s.view()
    check(ei, commitkv.StateError, "CKV_ERR_STATE", "closed")


def test_quota_exceeded(make_daemon, sid):
    d = make_daemon(config=f"[tenant.t]\nuids = {os.getuid()}\nquota = 2M\n")
    with commitkv.connect(d.socket, d.attach) as c:
        assert c.tenant == "t"
        with c.open_session(sid, 4, 4, 64) as s:
            with pytest.raises(commitkv.QuotaExceeded) as ei:
                for _ in range(100):  # protected tokens: nothing can be reclaimed
                    s.append(64, roles="system")
            check(ei, commitkv.QuotaExceeded, "CKV_ERR_QUOTA", "")
            assert c.stats()["arenas"][0]["bytes_used"] <= 2 << 20


def test_permission_denied_for_a_uid_that_is_no_tenant(make_daemon):
    if os.getuid() != 0:
        d = make_daemon(config=f"[tenant.t]\nuids = {os.getuid() + 4242}\n")
        with pytest.raises(commitkv.Error) as ei:
            commitkv.connect(d.socket, d.attach)
        check(ei, commitkv.PermissionDenied, "CKV_ERR_AUTH", "not mapped to any tenant")
        return
    # root is the daemon's admin: the worker that is no tenant runs as nobody
    d = make_daemon(config="[tenant.t]\nuids = 0\n")
    os.chmod(d.dir, 0o755)
    code = ("import commitkv, sys\n"
            "try:\n    commitkv.connect(sys.argv[1], sys.argv[2])\n"
            "except commitkv.Error as e:\n    print(type(e).__name__, e.status.name, e.text)\n")
    out = subprocess.run([sys.executable, "-c", code, d.socket, d.attach], capture_output=True, text=True,
                         timeout=60, preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
    assert out.stdout.startswith("PermissionDenied CKV_ERR_AUTH "), out.stdout + out.stderr
    assert "not mapped to any tenant" in out.stdout


def test_no_daemon_and_closed_client(tmp_path):
    with pytest.raises(commitkv.Error) as ei:
        commitkv.connect(f"ipc://{tmp_path}/none.sock", f"{tmp_path}/none.attach")
    assert ei.value.status.name in ("ENOENT", "ECONNREFUSED", "CKV_ERR_DISCONNECTED")
    assert "none.attach" in ei.value.text


def test_daemon_restarted_then_reconnect(make_daemon, sid):
    d = make_daemon()
    with commitkv.connect(d.socket, d.attach, heartbeat=False) as c:
        s = c.open_session(sid, L, H, D)
        s.append(1)
        d.restart()
        with pytest.raises(commitkv.Error) as ei:
            for _ in range(50):  # the first request may meet the old socket going away
                try:
                    c.stats()
                except commitkv.Timeout:
                    time.sleep(0.1)
        check(ei, commitkv.DaemonRestarted, "CKV_ERR_DAEMON_RESTARTED", "")
        assert c.restarted
        with pytest.raises(commitkv.DaemonRestarted):
            s.append(1)
        c.reconnect()
        assert not c.restarted
        with c.open_session(sid, L, H, D) as s2:  # the old daemon's sessions are gone
            assert s2.tokens == 0
        s.close()  # the stale handle closes quietly or says why
