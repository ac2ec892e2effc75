"""commitkv - the worker's side of CommitKV, from Python.

commitkvd owns the KV-cache memory of the node's inference workers.  This
module attaches to it (libcommitkv underneath), opens sessions, appends
tokens, writes their K/V straight into the daemon's arena (zero copy), reads
the published blocks back as read-only numpy arrays over the same memory,
runs the fused mixed-format attention kernel over them, and reports each
round's attention so the daemon moves tokens through draft, staged,
committed and recycled::

    import numpy as np, commitkv

    with commitkv.connect() as client:                      # $CKV_SOCKET honoured
        with client.open_session("chat-1", layers=2, kv_heads=4, head_dim=64) as s:
            first = s.append(3, roles="user")
            for layer in range(2):
                s.write_kv(first, layer, k, v)              # k, v: (3, 4, 64) float16
            out, mass = s.attention(0, q)                   # q: (n_q_heads, 64) float32
            result = s.report(1, mass)
            s.ack(result.epoch)
        print(client.stats()["bytes"])

Failures raise :class:`Error` subclasses (``QuotaExceeded``, ``NotFound``,
``DaemonRestarted``...) carrying ``status`` (name and number) and the daemon's
``text``; arrays of the wrong dtype or shape raise ``ValueError`` before
anything is sent.  Every call that may block, and every kernel, releases the
GIL, so threads sharing a client (or a session) run concurrently.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Iterator, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _commitkv
from ._errors import (
    AlreadyExists,
    Busy,
    Corrupt,
    DaemonRestarted,
    DeviceError,
    Disconnected,
    Error,
    FormatMismatch,
    InternalError,
    InvalidArgument,
    LimitExceeded,
    NoSpace,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ProtocolError,
    QuotaExceeded,
    StateError,
    Status,
    Timeout,
    TooLarge,
    Unsupported,
    VersionMismatch,
    from_status,
)

for _cls in (Error, Status, *[c for c in vars().values() if isinstance(c, type) and issubclass(c, Error)]):
    _cls.__module__ = __name__  # help() and tracebacks say commitkv.QuotaExceeded

__version__: str = _commitkv.__version__
PROTOCOL_VERSION: int = _commitkv.PROTOCOL_VERSION

__all__ = [
    "connect", "Client", "Session", "View", "Block", "RoundResult", "Transition", "Geometry",
    "Role", "Tag", "State", "Status", "Error", "from_status",
    "InvalidArgument", "ProtocolError", "VersionMismatch", "NotFound", "AlreadyExists", "QuotaExceeded",
    "NoSpace", "LimitExceeded", "OutOfRange", "PermissionDenied", "StateError", "FormatMismatch",
    "DaemonRestarted", "Timeout", "DeviceError", "Corrupt", "Unsupported", "Busy", "TooLarge",
    "Disconnected", "InternalError",
]


class Role(enum.IntEnum):
    """Who produced a token (commitkv.proto Role)."""

    UNSPECIFIED = 0
    SYSTEM = 1
    USER = 2
    ASSISTANT = 3
    TOOL = 4


class Tag(enum.IntFlag):
    """Dialogue-structure tags of a token (commitkv.proto Tag), combinable."""

    NONE = 0
    TURN_START = 1
    SENTENCE_START = 2
    CONFIRMATION = 4


class State(enum.IntEnum):
    """A token's lifecycle state (commitkv.proto TokenState)."""

    DRAFT = 0
    STAGED = 1
    COMMITTED = 2
    RECYCLED = 3


#: Block format numbers (kernels/format.h ckv_format) and their names.
FORMATS = {0: "draft", 1: "staged", 2: "int4", 3: "int2", 4: "rot4", 5: "rot3", 6: "rot2", 7: "rot1"}
_DTYPES = {"fp16": 0, "float16": 0, "bf16": 1, "bfloat16": 1}


class Geometry(NamedTuple):
    """A session's model geometry."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str  # "fp16" or "bf16"


class Transition(NamedTuple):
    """A run of `count` tokens from `first_position` that moved between states."""

    first_position: int
    count: int
    from_state: State
    to_state: State


class RoundResult(NamedTuple):
    """What :meth:`Session.report` returns."""

    epoch: int  #: view epoch after this round's published transitions (acknowledge it)
    pending: int  #: transitions still being compressed
    transitions: list  #: list of :class:`Transition`


def _buffer(x: Any, what: str) -> Any:
    """The object itself when it speaks the buffer protocol (numpy arrays,
    memoryviews, array.array); otherwise numpy's zero-copy view of it (a
    PyTorch CPU tensor through __array__).  No dtype conversion: the C side
    refuses a wrong dtype with a ValueError."""
    if x is None:
        return None
    try:
        memoryview(x).release()
        return x
    except TypeError:
        pass
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        return np.asarray(x)
    raise ValueError(f"{what}: an array (buffer protocol: numpy, memoryview, a CPU tensor) of the session's dtype "
                     f"(float16; uint16 bfloat16 bits for bf16 sessions) is required, got {type(x).__name__}")


def _per_token(values: Any, n: int, dtype: Any, what: str, names: Optional[type] = None) -> Optional[np.ndarray]:
    """None, one value for every token, or n values -> a contiguous array of n."""
    if values is None:
        return None
    if names is not None:
        if isinstance(values, str):
            values = names[values.upper()]
        elif isinstance(values, (list, tuple)):
            values = [names[v.upper()] if isinstance(v, str) else v for v in values]
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = np.broadcast_to(arr, (n,))
    if arr.shape != (n,):
        raise ValueError(f"{what}: {arr.shape[0] if arr.ndim == 1 else arr.shape} values for {n} tokens")
    return np.ascontiguousarray(arr, dtype=dtype)


class Block:
    """One published block of a view, over the mapped arena (zero copy).

    ``data`` is the whole block as read-only uint8; ``positions`` the session
    position of each slot (uint32, read-only); ``valid`` which slots hold a
    token (read each time it is asked).  Draft blocks also have ``k`` and
    ``v``: read-only arrays of shape (n_layers, capacity, n_kv_heads,
    head_dim), float16 (uint16 bit patterns for bf16 sessions).  Quantized
    formats keep their codes in ``data`` (layouts in kernels/format.h).
    Valid until the session acknowledges a newer epoch."""

    __slots__ = ("category", "format", "format_id", "id", "capacity", "nbytes", "data", "positions", "k", "v",
                 "_buffer", "_bitmap")

    def __init__(self, d: dict, geom: Geometry):
        buf = d["buffer"]
        self._buffer = buf
        self.category: str = d["category"]
        self.format_id: int = d["format"]
        self.format: str = FORMATS.get(self.format_id, f"format{self.format_id}")
        self.id: int = d["id"]
        self.capacity: int = d["capacity"]
        self.nbytes: int = d["bytes"]
        self.data: np.ndarray = np.frombuffer(buf, dtype=np.uint8)
        cap = self.capacity
        if d["positions_offset"] >= 0:
            self.positions = np.frombuffer(buf, dtype=np.uint32, count=cap, offset=d["positions_offset"])
            self._bitmap = np.frombuffer(buf, dtype=np.uint8, count=(cap + 63) // 64 * 8, offset=d["bitmap_offset"])
        else:
            self.positions = np.zeros(0, dtype=np.uint32)
            self._bitmap = np.zeros(0, dtype=np.uint8)
        self.k: Optional[np.ndarray] = None
        self.v: Optional[np.ndarray] = None
        strides = d["draft_strides"]
        if strides is not None:
            layer_stride, kv_stride, slot_stride = strides
            dt = np.dtype(np.float16 if geom.dtype == "fp16" else np.uint16)
            shape = (geom.n_layers, cap, geom.n_kv_heads, geom.head_dim)
            st = (layer_stride, slot_stride, geom.head_dim * dt.itemsize, dt.itemsize)
            self.k = np.ndarray(shape, dtype=dt, buffer=buf, offset=d["payload_offset"], strides=st)
            self.v = np.ndarray(shape, dtype=dt, buffer=buf, offset=d["payload_offset"] + kv_stride, strides=st)

    @property
    def valid(self) -> np.ndarray:
        """Bool per slot: whether it holds a token now."""
        return np.unpackbits(self._bitmap, bitorder="little")[: self.capacity].astype(bool)

    def slot_of(self, position: int) -> Optional[int]:
        """The valid slot holding `position`, or None."""
        hits = np.nonzero((self.positions == position) & self.valid)[0]
        return int(hits[0]) if hits.size else None

    def __repr__(self) -> str:
        return f"<commitkv.Block {self.category} {self.format} id={self.id} capacity={self.capacity}>"


class View:
    """A session's published blocks at one epoch (see :meth:`Session.view`)."""

    def __init__(self, epoch: int, n_tokens: int, blocks: list):
        self.epoch = epoch
        self.n_tokens = n_tokens
        self.blocks: list = blocks
        self.draft = [b for b in blocks if b.category == "draft"]
        self.staged = [b for b in blocks if b.category == "staged"]
        self.committed = [b for b in blocks if b.category == "committed"]
        #: blocks whose every token was demoted (kept, not read every round: see Session.attention)
        self.cold = [b for b in blocks if b.category == "cold"]

    def locate(self, position: int) -> Optional[tuple]:
        """(block, slot) of the token at `position`, or None (recycled, or not in this view)."""
        for b in self.blocks:
            slot = b.slot_of(position)
            if slot is not None:
                return b, slot
        return None

    def kv(self, position: int, layer: int) -> tuple:
        """Read-only (k, v) arrays (n_kv_heads, head_dim) of a draft token, zero copy.
        Raises LookupError when the token is not held in draft format."""
        hit = self.locate(position)
        if hit is None or hit[0].k is None:
            raise LookupError(f"position {position} is not a draft token of this view")
        b, slot = hit
        return b.k[layer, slot], b.v[layer, slot]

    def __iter__(self) -> Iterator[Block]:
        return iter(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    def __repr__(self) -> str:
        return (f"<commitkv.View epoch={self.epoch} tokens={self.n_tokens} draft={len(self.draft)} "
                f"staged={len(self.staged)} committed={len(self.committed)} cold={len(self.cold)}>")


class Session:
    """One session of a client: a conversation's KV cache in the daemon.

    A context manager: leaving the ``with`` block drops the session (its
    memory is freed), or detaches it (the daemon keeps it for resume) when
    ``keep`` is true.  Methods may be called from several threads."""

    def __init__(self, client: "Client", handle: Any, keep: bool):
        self._client = client
        self._s = handle
        self.keep: bool = keep
        n_layers, heads, dim, dtype = handle.geometry
        self.geometry = Geometry(n_layers, heads, dim, "bf16" if dtype == 1 else "fp16")

    @property
    def id(self) -> str:
        return self._s.id

    @property
    def tokens(self) -> int:
        """Tokens appended so far (the next position)."""
        return self._s.tokens

    @property
    def epoch(self) -> int:
        """The newest view epoch this client has heard of."""
        return self._s.epoch

    @property
    def matched_tokens(self) -> int:
        """Tokens the session started with from shared blocks (reuse_prefix or a fork; 0 otherwise)."""
        return self._s.matched_tokens

    def fork(self, new_id: str, at: Optional[int] = None, *, keep: bool = False) -> "Session":
        """A sub-agent: session `new_id` on this client that starts with this
        session's first `at` tokens (None: all it reported a round over) and
        diverges after.  Whole draft blocks are shared with this session
        (read-only to both), a partial tail is copied.  Raises StateError when
        a token before `at` was compressed, recycled or not reported yet,
        AlreadyExists, OutOfRange."""
        return Session(self._client, self._s.fork(str(new_id), int(at or 0)), keep)

    @property
    def closed(self) -> bool:
        return self._s.closed

    def append(self, n: int, roles: Any = None, tags: Any = None, semantic: Any = None,
               token_ids: Any = None) -> int:
        """Appends `n` tokens and returns the position of the first.

        Each of roles (:class:`Role`, its name, or an int), tags (:class:`Tag`),
        semantic (float in [0, 1]) and token_ids is None, one value for all
        `n` tokens, or `n` values.  The tokens get draft slots: write their
        K/V with :meth:`write_kv` before the next :meth:`report`."""
        return self._s.append(
            int(n),
            _per_token(roles, n, np.uint8, "roles", Role),
            _per_token(tags, n, np.uint8, "tags", Tag),
            _per_token(semantic, n, np.float32, "semantic"),
            _per_token(token_ids, n, np.uint32, "token_ids"),
        )

    def write_kv(self, pos: int, layer: int, k: Any, v: Any) -> int:
        """Copies K and V of one layer into the draft slots from `pos` on.

        k and v are buffer-protocol arrays (numpy, memoryview, or a PyTorch CPU
        tensor) of the session's dtype (float16; uint16 bfloat16 bits for bf16
        sessions), C-contiguous, shaped (n_kv_heads, head_dim) for one token or
        (n, n_kv_heads, head_dim) for n; either may be None to skip it.  Read
        in place, never converted: a wrong dtype or shape is a ValueError.
        Returns the number of tokens written."""
        return self._s.write_kv(int(pos), int(layer), _buffer(k, "k"), _buffer(v, "v"))

    def view(self) -> View:
        """The published blocks as read-only numpy arrays over the mapped arena.

        Zero copy: the arrays are the daemon's memory; they stay valid until
        this session acknowledges a newer epoch (:meth:`ack`)."""
        epoch, n_tokens, blocks = self._s.view()
        return View(epoch, n_tokens, [Block(d, self.geometry) for d in blocks])

    def attention(self, layer: int, q: Any, scale: Optional[float] = None, *, threads: int = 0,
                  extra_k: Any = None, extra_v: Any = None, cold_max_blocks: int = 4,
                  cold_min_weight: float = 0.01, cold_gather: int = 0) -> tuple:
        """Fused decode attention of `q` over every block of the current view.

        q: (n_q_heads, head_dim) or (n_rows, n_q_heads, head_dim), n_q_heads a
        multiple of n_kv_heads (converted to float32 if it is not).  The kernel
        reads draft, staged and committed blocks in place, and the cold blocks
        (demoted tokens) a query row could need: those whose key bounds could
        take cold_min_weight of a head's attention, at most cold_max_blocks
        per row (0: no cap), as ckv_session_cold_select_top chooses them.  cold_gather > 0 reads
        the cold tier per token instead, as the C reference worker does (64): per query row the
        cold_gather cold tokens that take the largest share of a head's attention over the cold
        tokens (ckv_session_cold_gather: rotated cold blocks scored exactly from their codes), as
        FP16 in a private block, each row attended on its own over the view and its tokens; the
        gathered tokens' mass counts at their positions, so :meth:`report` can recall them
        (cold_max_blocks and cold_min_weight are not used then; each row's block holds every layer,
        and one call's blocks at most 256 MiB: a ValueError asks for fewer rows).  scale defaults to
        1/sqrt(head_dim); threads 0 lets the kernel choose.  extra_k, extra_v:
        optional K/V of this layer for tokens the session does not hold,
        (n, n_kv_heads, head_dim) (converted to float16, 1 <= n <= 4096),
        attended after the view's as a private draft block (greedy decoding
        that appends nothing: the C worker's "aside" block); fp16 sessions
        only.  Returns (out, attention_mass): out shaped like q (float32),
        attention_mass one float32 per session position (summed over rows and
        heads; the extra tokens' share is not in it), ready for :meth:`report`."""
        qa = np.ascontiguousarray(np.asarray(q), dtype=np.float32)
        ek = ev = None
        if extra_k is not None or extra_v is not None:
            if extra_k is None or extra_v is None:
                raise ValueError("extra_k and extra_v go together")
            ek = np.ascontiguousarray(np.asarray(extra_k), dtype=np.float16)
            ev = np.ascontiguousarray(np.asarray(extra_v), dtype=np.float16)
        out, mass, _epoch, _n = self._s.attention(int(layer), qa, 0.0 if scale is None else float(scale),
                                                  int(threads), ek, ev, int(cold_max_blocks), float(cold_min_weight),
                                                  int(cold_gather))
        return np.frombuffer(out, dtype=np.float32).reshape(qa.shape), np.frombuffer(mass, dtype=np.float32)

    def report(self, round: int, attention_mass: Any, semantic: Any = None, *, first_position: int = 0) -> RoundResult:
        """Reports round `round` (strictly increasing from 1).

        attention_mass[i] is the mass of position first_position + i.
        semantic: optional semantic-score updates, a mapping {position: score}
        or a sequence of scores for positions 0, 1, ...  Returns a
        :class:`RoundResult` with the transitions and the new epoch."""
        mass = np.ascontiguousarray(np.asarray(attention_mass), dtype=np.float32).reshape(-1)
        pos = scores = None
        if semantic is not None:
            if isinstance(semantic, Mapping):
                pos = np.fromiter(semantic.keys(), dtype=np.uint32, count=len(semantic))
                scores = np.fromiter(semantic.values(), dtype=np.float32, count=len(semantic))
            else:
                scores = np.ascontiguousarray(np.asarray(semantic), dtype=np.float32).reshape(-1)
                pos = np.arange(scores.size, dtype=np.uint32)
        epoch, pending, trans = self._s.report(int(round), mass, int(first_position), pos, scores)
        return RoundResult(epoch, pending, [Transition(f, c, State(a), State(b)) for f, c, a, b in trans])

    def settle(self, timeout: float = 5.0, poll: float = 0.001) -> int:
        """Waits until the daemon has published this session's pending moves
        (its pending token count is 0, or has not changed for 5 polls while
        the compressor had no job: the rest waits for more tokens by design,
        e.g. a partial committed chunk), at most `timeout` seconds.  Acknowledges nothing.  Returns the tokens
        still pending.  With a settle after each report, a worker sees the
        same states on every run (compressions are asynchronous otherwise)."""
        deadline = time.monotonic() + timeout
        last, quiet = None, 0
        while True:
            epoch, pending, queue = self._s.info()
            quiet = quiet + 1 if (epoch, pending) == last and queue == 0 else 0
            last = (epoch, pending)
            if pending == 0 or quiet >= 5 or time.monotonic() >= deadline:
                return pending
            time.sleep(poll)

    def ack(self, epoch: int) -> int:
        """This client reads nothing older than `epoch` any more; returns the bytes the daemon freed.
        Arrays of older views must not be read after this."""
        return self._s.ack(int(epoch))

    def prefetch(self) -> bool:
        """Asks for the session to be resident before its next round: one the daemon moved to disk
        starts coming back and the call returns at once.  True when its K/V is in memory now (a view,
        append or report waits for it either way); call it when a request for the session is coming."""
        return self._s.prefetch()

    def close(self, keep: Optional[bool] = None) -> None:
        """Drops the session, or detaches it (kept for resume) with keep=True
        (default: the `keep` given to open_session).  Idempotent."""
        self._s.close(keep=self.keep if keep is None else bool(keep))

    def detach(self) -> None:
        """close(keep=True)."""
        self.close(keep=True)

    def drop(self) -> None:
        """close(keep=False)."""
        self.close(keep=False)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.tokens} tokens"
        return f"<commitkv.Session {self.id!r} {state}>"


def _u32_bytes(ids: Any) -> bytes:
    """token ids as packed native uint32 (numpy arrays, array('I'), lists, bytes)."""
    if isinstance(ids, (bytes, bytearray)):
        return bytes(ids)
    a = np.ascontiguousarray(np.asarray(ids), dtype=np.uint32)
    if a.ndim != 1:
        raise ValueError(f"token_ids: a 1-d sequence of uint32, got shape {a.shape}")
    return a.tobytes()


class Client:
    """A connection to commitkvd (see :func:`connect`); a context manager that closes it."""

    def __init__(self, handle: Any):
        self._c = handle

    def open_session(self, id: str, layers: Optional[int], kv_heads: Optional[int], head_dim: Optional[int],
                     dtype: Union[str, int] = "fp16", policy: Optional[str] = None,
                     params: Optional[Mapping[str, float]] = None, resume: bool = False, *, keep: bool = False,
                     draft_block_tokens: int = 0, commit_block_tokens: int = 0, token_ids: Any = None,
                     reuse_prefix: bool = False, model_id: Optional[str] = None,
                     model_revision: Optional[str] = None) -> Session:
        """Opens session `id` (1..128 of [A-Za-z0-9._:-]), or resumes a detached one.

        layers, kv_heads, head_dim, dtype ("fp16" or "bf16"): the model's KV
        geometry (None when resuming).  policy: a policy name (None: the
        daemon's default); params: per-session policy overrides ([policy]
        keys -> numbers).  keep: what leaving the ``with`` block does
        (detach instead of drop).  token_ids (a sequence or buffer of uint32)
        with reuse_prefix=True: the session starts on the tenant's shared
        blocks matching the leading whole blocks of token_ids
        (``session.matched_tokens`` says how many; append from there).
        model_id / model_revision: what computes the K/V (part of the
        session's identity and of the prefix keys).  Raises AlreadyExists,
        NotFound (resume), LimitExceeded, InvalidArgument, QuotaExceeded..."""
        if isinstance(dtype, str):
            if dtype.lower() not in _DTYPES:
                raise ValueError(f"dtype: {dtype!r}; wanted 'fp16' or 'bf16'")
            dt = _DTYPES[dtype.lower()]
        else:
            dt = int(dtype)
        names = tuple(params.keys()) if params else ()
        values = tuple(float(params[k]) for k in names) if params else ()
        ids = _u32_bytes(token_ids) if token_ids is not None else None
        h = self._c.open_session(str(id), int(layers or 0), int(kv_heads or 0), int(head_dim or 0), dt, policy,
                                 names, values, bool(resume), int(draft_block_tokens), int(commit_block_tokens),
                                 ids, bool(reuse_prefix), model_id, model_revision)
        return Session(self, h, keep)

    def lookup_prefix(self, token_ids: Any, model_id: Optional[str] = None,
                      model_revision: Optional[str] = None) -> int:
        """How many leading tokens of token_ids (uint32) this tenant's shared
        blocks of that model hold: a session opened with reuse_prefix on them
        needs no prefill for that many (a multiple of the draft block size).
        Answered in this process from the tenant's published prefix index
        (no request to the daemon) when it is mapped; a hint either way."""
        return self._c.lookup_prefix(_u32_bytes(token_ids), model_id, model_revision)

    def stats(self) -> dict:
        """The daemon's figures: the object ``commitkvctl stats --json`` prints, as a dict."""
        return self._c.stats()

    def heartbeat(self) -> None:
        """One heartbeat now (the background thread sends them by itself)."""
        self._c.heartbeat()

    def reconnect(self) -> None:
        """After DaemonRestarted: attach to the new daemon (sessions must be opened again)."""
        self._c.reconnect()

    @property
    def tenant(self) -> str:
        return self._c.tenant

    @property
    def memory_kind(self) -> str:
        """Where the arena lives: "host", "cuda" or "none"."""
        return self._c.memory_kind

    @property
    def lease_ms(self) -> int:
        return self._c.lease_ms

    @property
    def restarted(self) -> bool:
        """True between noticing a daemon restart and a successful reconnect."""
        return self._c.restarted

    @property
    def closed(self) -> bool:
        return self._c.closed

    def close(self) -> None:
        """Detaches the sessions still open and disconnects.  The arena stays
        mapped until the last array of a view is released.  Idempotent."""
        self._c.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<commitkv.Client {'closed' if self.closed else 'tenant ' + repr(self.tenant)}>"


def connect(socket: Optional[str] = None, attach_socket: Optional[str] = None, heartbeat: bool = True, *,
            name: str = "python", timeout_ms: int = 0) -> Client:
    """Attaches to commitkvd and maps the tenant's arena.

    socket: the daemon's ZeroMQ endpoint (None: $CKV_SOCKET, else the
    runtime directory's commitkvd.sock); attach_socket: its unix attach
    socket (None: $CKV_ATTACH_SOCKET, else beside the socket).  heartbeat
    keeps the lease alive from a background thread (and reconnects after a
    daemon restart).  timeout_ms: per request (0: 5000).  Raises
    PermissionDenied (this uid is no tenant), Disconnected or Error
    (ENOENT, ECONNREFUSED: no daemon there), Timeout, VersionMismatch."""
    return Client(_commitkv.connect(socket, attach_socket, bool(heartbeat), name, int(timeout_ms)))
