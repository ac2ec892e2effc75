"""Fixtures of the commitkv Python suite: a real commitkvd on a temporary socket.

The daemon is started the way tests/support/testutil.c ckv_test_daemon_start
starts one (host memory, metrics off, its own state directory), from
$CKV_BIN_DIR (ctest sets it; default build/bin), and stopped with SIGTERM.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("CKV_BIN_DIR", os.path.join(ROOT, "build", "bin"))


def daemon_env():
    """The daemon's environment: a sanitizer build preloads libasan into
    python3 (tests/python/CMakeLists.txt); commitkvd carries its own runtime
    and keeps its leak checks."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "CKV_DAEMON_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["CKV_DAEMON_ASAN_OPTIONS"]
    return env


class Daemon:
    """One commitkvd: socket, attach, dir; start(), stop(), restart(), ctl()."""

    def __init__(self, extra=(), config=None):
        self.dir = tempfile.mkdtemp(prefix="ckv-py-")
        self.socket = f"ipc://{self.dir}/commitkvd.sock"
        self.attach = f"{self.dir}/commitkvd.attach"
        self.log = f"{self.dir}/commitkvd.log"
        self.extra = list(extra)
        if config is not None:
            path = os.path.join(self.dir, "commitkvd.conf")
            with open(path, "w") as f:
                f.write(config)
            self.extra = ["--config", path] + self.extra
        self.proc = None

    def start(self):
        argv = [os.path.join(BIN_DIR, "commitkvd"), "--socket", self.socket, "--attach-socket", self.attach,
                "--state-dir", self.dir, "--set", "daemon.metrics=", "--backend", "host"] + self.extra
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=daemon_env())
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if os.path.exists(self.attach):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"commitkvd did not start: {self.log_tail()}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
            self.proc = None
            return rc
        return None

    def restart(self):
        assert self.stop() == 0, self.log_tail()
        return self.start()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def ctl(self, *args):
        out = subprocess.run([os.path.join(BIN_DIR, "commitkvctl"), "--socket", self.socket, "--attach-socket",
                              self.attach] + list(args), capture_output=True, text=True, timeout=30,
                             env=daemon_env())
        assert out.returncode == 0, out.stderr
        return out.stdout

    def stats(self):
        return json.loads(self.ctl("stats", "--json"))

    def log_tail(self, n=4000):
        try:
            with open(self.log) as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def cleanup(self):
        rc = self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


@pytest.fixture
def make_daemon():
    """Factory: make_daemon(extra=(), config=None) -> a started Daemon, stopped (cleanly) at the end."""
    made = []

    def make(extra=(), config=None):
        d = Daemon(extra, config)
        made.append(d)
        return d.start()

    yield make
    for d in made:
        alive = d.alive()
        rc = d.cleanup()
        assert not alive or rc == 0, f"commitkvd exited with {rc}:\n{d.log_tail()}"


@pytest.fixture(scope="module")
def daemon():
    """One daemon for a whole test module."""
    d = Daemon().start()
    yield d
    alive = d.alive()
    rc = d.cleanup()
    assert not alive or rc == 0, f"commitkvd exited with {rc}"


@pytest.fixture
def client(daemon):
    import commitkv

    with commitkv.connect(daemon.socket, daemon.attach) as c:
        yield c


_ids = iter(range(1 << 30))


@pytest.fixture
def sid(request):
    """A session id unique in this run."""
    return "py-" + re.sub(r"[^A-Za-z0-9.:-]", "-", request.node.name[:60]) + f"-{next(_ids)}"
