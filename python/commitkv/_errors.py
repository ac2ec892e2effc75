"""commitkv errors: one exception class per ckv_status, all under commitkv.Error.

Every failure libcommitkv or the daemon reports is raised as an instance of
:class:`Error` (or of its subclass for that status) that carries

* ``status``: a :class:`Status` member, whose ``name`` is the ckv_status name
  (``"CKV_ERR_QUOTA"``, or ``"ENOENT"`` for a folded errno) and whose integer
  value is the number on the wire (``-1006``);
* ``text``: the daemon's (or the library's) explanation of this failure.

Wrong arguments that never reach the daemon (a K/V array of the wrong dtype
or shape) are ``ValueError``s instead, as in the rest of Python.
"""

from __future__ import annotations

import enum

from . import _commitkv

_TABLE = _commitkv.status_table()


class _StatusBase(enum.IntEnum):
    @classmethod
    def _missing_(cls, value):
        # Folded -errno values (commitkv/status.h): a pseudo-member named
        # after the errno ("ENOENT"), so every status has a name and a number.
        if isinstance(value, int) and -4095 <= value < 0:
            member = int.__new__(cls, value)
            member._name_ = _commitkv.status_name(value)
            member._value_ = value
            return member
        return None

    @property
    def text(self) -> str:
        """ckv_strerror(): the generic text of this status."""
        return _commitkv.strerror(int(self))

    def __str__(self) -> str:
        return f"{self.name} ({int(self)})"


Status = _StatusBase("Status", [(name, value) for name, value, _ in _TABLE], module=__name__)
Status.__doc__ = """A ckv_status: its name (``Status.CKV_ERR_QUOTA.name``) and number (``int(...)``).

Members mirror commitkv/status.h; negated errno values become pseudo-members
named after the errno (``Status(-2).name == "ENOENT"``)."""


class Error(Exception):
    """Base class of every commitkv failure.

    Attributes: ``status`` (:class:`Status`), ``code`` (its number) and
    ``text`` (the daemon's explanation)."""

    def __init__(self, status: int, text: str = ""):
        self.status = Status(status)
        self.code = int(self.status)
        self.text = text or self.status.text
        super().__init__(f"{self.text} [{self.status.name} {self.code}]")


class InvalidArgument(Error, ValueError):
    """CKV_ERR_INVALID: the daemon refused an argument or request as invalid."""


class ProtocolError(Error):
    """CKV_ERR_PROTO: a message could not be decoded."""


class VersionMismatch(Error):
    """CKV_ERR_VERSION: client and daemon speak no common protocol version."""


class NotFound(Error, LookupError):
    """CKV_ERR_NOT_FOUND: no such session or object (e.g. resuming an unknown id)."""


class AlreadyExists(Error):
    """CKV_ERR_EXISTS: a session with this id is open already."""


class QuotaExceeded(Error):
    """CKV_ERR_QUOTA: the tenant's quota is exceeded and nothing more can be reclaimed."""


class NoSpace(Error):
    """CKV_ERR_NOSPACE: the arena's memory is exhausted."""


class LimitExceeded(Error):
    """CKV_ERR_LIMIT: a value beyond a configured limit (geometry, session count...)."""


class OutOfRange(Error, IndexError):
    """CKV_ERR_RANGE: an index out of range (no draft slot for that position, a layer too far)."""


class PermissionDenied(Error):
    """CKV_ERR_AUTH: not authenticated (this uid is no tenant) or not allowed."""


class StateError(Error):
    """CKV_ERR_STATE: the object is in the wrong state (e.g. a closed session)."""


class FormatMismatch(Error):
    """CKV_ERR_FORMAT: a block or build format that does not match."""


class DaemonRestarted(Error):
    """CKV_ERR_DAEMON_RESTARTED: the daemon restarted; reconnect and open the sessions again."""


class Timeout(Error, TimeoutError):
    """CKV_ERR_TIMEOUT: the daemon did not answer in time."""


class DeviceError(Error):
    """CKV_ERR_DEVICE: a GPU error, or no usable device."""


class Corrupt(Error):
    """CKV_ERR_CORRUPT: data failed its checksum or magic."""


class Unsupported(Error):
    """CKV_ERR_UNSUPPORTED: not supported by this build or backend (e.g. views of GPU memory)."""


class Busy(Error):
    """CKV_ERR_BUSY: the resource is busy; retry later."""


class TooLarge(Error):
    """CKV_ERR_TOO_LARGE: a message or request too large."""


class Disconnected(Error, ConnectionError):
    """CKV_ERR_DISCONNECTED: not connected to the daemon (or this client is closed)."""


class InternalError(Error):
    """CKV_ERR_INTERNAL: a bug; please report it."""


CLASSES: dict[str, type[Error]] = {
    "CKV_ERR_INVALID": InvalidArgument,
    "CKV_ERR_PROTO": ProtocolError,
    "CKV_ERR_VERSION": VersionMismatch,
    "CKV_ERR_NOT_FOUND": NotFound,
    "CKV_ERR_EXISTS": AlreadyExists,
    "CKV_ERR_QUOTA": QuotaExceeded,
    "CKV_ERR_NOSPACE": NoSpace,
    "CKV_ERR_LIMIT": LimitExceeded,
    "CKV_ERR_RANGE": OutOfRange,
    "CKV_ERR_AUTH": PermissionDenied,
    "CKV_ERR_STATE": StateError,
    "CKV_ERR_FORMAT": FormatMismatch,
    "CKV_ERR_DAEMON_RESTARTED": DaemonRestarted,
    "CKV_ERR_TIMEOUT": Timeout,
    "CKV_ERR_DEVICE": DeviceError,
    "CKV_ERR_CORRUPT": Corrupt,
    "CKV_ERR_UNSUPPORTED": Unsupported,
    "CKV_ERR_BUSY": Busy,
    "CKV_ERR_TOO_LARGE": TooLarge,
    "CKV_ERR_DISCONNECTED": Disconnected,
    "CKV_ERR_INTERNAL": InternalError,
}


def from_status(status: int, text: str = "") -> Error:
    """The exception for a ckv_status number: its subclass, or Error itself
    for statuses without one (folded errno values such as -ENOENT)."""
    st = Status(status)
    return CLASSES.get(st.name, Error)(st, text)


_commitkv._set_error_factory(from_status)
