"""The traylm-gpud wire protocol: one JSON object per line over a unix socket, strictly checked.

Requests (``id`` is optional and echoed back)::

    {"op": "status"}
    {"op": "apply_curve", "gpu": UUID, "curve": {...}, "fans": [0, 1], "persist": true}
    {"op": "restore_fans", "gpu": UUID | "all"}
    {"op": "apply_power", "gpu": UUID, "limit_mw": 300000, "persist": true, "source": "user"}
    {"op": "restore_power", "gpu": UUID | "all", "source": "user" | "guard" | "tune"}
    {"op": "apply_clocks", "gpu": UUID, "clock": "sm" | "memory", "min_mhz": 210,
     "max_mhz": 1800, "persist": false}
    {"op": "restore_clocks", "gpu": UUID | "all", "clock": "sm" | "memory" | "all"}

Answers: ``{"ok": true, "id": N, "result": {...}}`` or
``{"ok": false, "id": N, "error": CODE, "message": TEXT}``. Anything else (bad JSON, duplicate
keys, NaN, unknown ops or keys, wrong types, oversized lines) is refused with ``bad_request``.
Values are further checked against the card by the helper before anything is applied.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_LINE_BYTES = 16 * 1024
OPS = (
    "status",
    "apply_curve",
    "restore_fans",
    "apply_power",
    "restore_power",
    "apply_clocks",
    "restore_clocks",
)
CLOCKS = ("sm", "memory")
MAX_CLOCK_MHZ = 100_000
SOURCES = ("user", "guard", "tune")
UUID_RE = re.compile(r"^GPU-[0-9A-Fa-f-]{8,64}$")
_KEYS = {
    "status": {"op", "id"},
    "apply_curve": {"op", "id", "gpu", "curve", "fans", "persist"},
    "restore_fans": {"op", "id", "gpu"},
    "apply_power": {"op", "id", "gpu", "limit_mw", "persist", "source"},
    "restore_power": {"op", "id", "gpu", "source"},
    "apply_clocks": {"op", "id", "gpu", "clock", "min_mhz", "max_mhz", "persist"},
    "restore_clocks": {"op", "id", "gpu", "clock"},
}
_REQUIRED = {
    "status": {"op"},
    "apply_curve": {"op", "gpu", "curve"},
    "restore_fans": {"op", "gpu"},
    "apply_power": {"op", "gpu", "limit_mw"},
    "restore_power": {"op", "gpu"},
    "apply_clocks": {"op", "gpu", "clock", "min_mhz", "max_mhz"},
    "restore_clocks": {"op", "gpu"},
}


class ProtocolError(Exception):
    """A request refused before it reached the GPUs; ``code`` goes on the wire."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Request:
    op: str
    id: int | None = None
    gpu: str = ""
    curve: dict[str, Any] | None = None
    fans: tuple[int, ...] | None = None
    limit_mw: int | None = None
    persist: bool = False
    source: str = "user"
    clock: str = "all"
    min_mhz: int | None = None
    max_mhz: int | None = None


def parse_request(line: bytes) -> Request:
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"request longer than {MAX_LINE_BYTES} bytes")
    try:
        data = json.loads(line, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError("a request must be a JSON object")
    op = data.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    extra = set(data) - _KEYS[op]
    if extra:
        raise ProtocolError(f"unknown keys for {op}: {', '.join(sorted(extra))}")
    missing = _REQUIRED[op] - set(data)
    if missing:
        raise ProtocolError(f"{op} needs {', '.join(sorted(missing))}")
    rid = data.get("id")
    if rid is not None and (not _is_int(rid) or not 0 <= rid < 2**53):
        raise ProtocolError("id must be a non-negative whole number")
    req = Request(op=op, id=rid)
    if "gpu" in data:
        req = _with(req, gpu=_gpu(data["gpu"], allow_all=op.startswith("restore")))
    if "curve" in data:
        if not isinstance(data["curve"], dict):
            raise ProtocolError("curve must be an object with points")
        req = _with(req, curve=data["curve"])
    if "fans" in data:
        req = _with(req, fans=_fans(data["fans"]))
    if "limit_mw" in data:
        value = data["limit_mw"]
        if not _is_int(value) or not 1_000 <= value <= 5_000_000:
            raise ProtocolError("limit_mw must be a whole number of milliwatts (1000-5000000)")
        req = _with(req, limit_mw=value)
    if "persist" in data:
        if not isinstance(data["persist"], bool):
            raise ProtocolError("persist must be true or false")
        req = _with(req, persist=data["persist"])
    if "clock" in data:
        allowed = CLOCKS if op == "apply_clocks" else (*CLOCKS, "all")
        if data["clock"] not in allowed:
            raise ProtocolError(f"clock must be one of {', '.join(allowed)}")
        req = _with(req, clock=data["clock"])
    for key in ("min_mhz", "max_mhz"):
        if key in data:
            value = data[key]
            if not _is_int(value) or not 1 <= value <= MAX_CLOCK_MHZ:
                raise ProtocolError(f"{key} must be a whole number of MHz (1-{MAX_CLOCK_MHZ})")
            req = _with(req, **{key: value})
    if "source" in data:
        if data["source"] not in SOURCES:
            raise ProtocolError(f"source must be one of {', '.join(SOURCES)}")
        req = _with(req, source=data["source"])
    return req


def encode_request(op: str, **fields: Any) -> bytes:
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode() + b"\n"


def ok(rid: int | None, result: Any) -> bytes:
    return (
        json.dumps({"ok": True, "id": rid, "result": result}, separators=(",", ":")).encode()
        + b"\n"
    )


def refused(rid: int | None, code: str, message: str) -> bytes:
    body = {"ok": False, "id": rid, "error": code, "message": message}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def _with(req: Request, **changes: Any) -> Request:
    from dataclasses import replace

    return replace(req, **changes)


def _gpu(value: Any, *, allow_all: bool) -> str:
    if allow_all and value == "all":
        return "all"
    if not isinstance(value, str) or not UUID_RE.match(value):
        extra = ' or "all"' if allow_all else ""
        raise ProtocolError(f"gpu must be a GPU UUID (GPU-...){extra}")
    return value


def _fans(value: Any) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= 32
        or not all(_is_int(v) and 0 <= v < 32 for v in value)
        or len(set(value)) != len(value)
    ):
        raise ProtocolError("fans must be a list of distinct fan indices (0-31)")
    return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")
