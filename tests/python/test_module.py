"""The module itself: version, statuses and their exception classes, docs, stubs."""

import ast
import os
import pydoc

import commitkv
from commitkv import _commitkv


def test_version_matches_the_project():
    src = os.environ.get("CKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    with open(os.path.join(src, "CMakeLists.txt")) as f:
        text = f.read()
    assert f"project(CommitKV VERSION {commitkv.__version__} " in text
    assert commitkv.PROTOCOL_VERSION >= 1


def test_every_status_has_a_name_a_number_and_its_class():
    table = _commitkv.status_table()
    names = {name for name, _, _ in table}
    assert {"CKV_OK", "CKV_ERR_QUOTA", "CKV_ERR_NOT_FOUND", "CKV_ERR_DAEMON_RESTARTED"} <= names
    for name, value, text in table:
        st = commitkv.Status(value)
        assert st.name == name and int(st) == value and st.text == text
        if value == 0:
            continue
        e = commitkv.from_status(value, "the daemon's words")
        assert isinstance(e, commitkv.Error)
        assert type(e) is not commitkv.Error, f"{name} has no class of its own"
        assert e.status is st and e.code == value and e.text == "the daemon's words"
        assert name in str(e) and str(value) in str(e)
    # every class is reachable from exactly one status
    classes = [type(commitkv.from_status(v)) for n, v, _ in table if v]
    assert len(classes) == len(set(classes))
    specific = {
        -1006: commitkv.QuotaExceeded, -1004: commitkv.NotFound, -1013: commitkv.DaemonRestarted,
        -1001: commitkv.InvalidArgument, -1005: commitkv.AlreadyExists, -1008: commitkv.LimitExceeded,
        -1009: commitkv.OutOfRange, -1010: commitkv.PermissionDenied, -1011: commitkv.StateError,
        -1014: commitkv.Timeout, -1020: commitkv.Disconnected, -1017: commitkv.Unsupported, -1018: commitkv.Busy,
    }
    for code, cls in specific.items():
        assert type(commitkv.from_status(code)) is cls
    # Pythonic bases where they exist
    assert isinstance(commitkv.from_status(-1001), ValueError)
    assert isinstance(commitkv.from_status(-1009), IndexError)
    assert isinstance(commitkv.from_status(-1014), TimeoutError)
    assert isinstance(commitkv.from_status(-1020), ConnectionError)


def test_folded_errno_statuses_are_plain_errors_with_their_errno_name():
    e = commitkv.from_status(-2, "")
    assert type(e) is commitkv.Error
    assert e.status.name == "ENOENT" and int(e.status) == -2
    assert "No such file" in e.text


def test_help_reads_well():
    text = pydoc.render_doc(commitkv, renderer=pydoc.plaintext)
    for word in ("connect(", "class Client", "class Session", "open_session(", "write_kv(", "attention(",
                 "report(", "ack(", "stats(", "class QuotaExceeded", "zero copy"):
        assert word in text, word
    for fn in (commitkv.connect, commitkv.Client.open_session, commitkv.Session.append, commitkv.Session.write_kv,
               commitkv.Session.view, commitkv.Session.attention, commitkv.Session.report, commitkv.Session.ack,
               commitkv.Client.stats):
        assert fn.__doc__ and len(fn.__doc__) > 40, fn
    assert commitkv.QuotaExceeded.__module__ == "commitkv"


def test_stubs_name_what_the_module_exports():
    path = os.path.join(os.path.dirname(commitkv.__file__), "__init__.pyi")
    assert os.path.exists(os.path.join(os.path.dirname(commitkv.__file__), "py.typed"))
    with open(path) as f:
        tree = ast.parse(f.read())
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    missing = {n for n in commitkv.__all__ if n not in stubbed}
    assert not missing, f"not in {path}: {missing}"
    session = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    methods = {n.name for n in session.body if isinstance(n, ast.FunctionDef)}
    assert {"append", "write_kv", "view", "attention", "report", "ack", "close"} <= methods
