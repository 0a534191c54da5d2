"""The pairing exchange's pure parts: the one-time code, and the proofs each side gives that
it knows the code, bound to both certificates (docs/architecture/flows/pairing.md).

The code is 10 characters from an alphabet without look-alikes (no 0/O, 1/I/L): about 49 bits.
A proof is HMAC-SHA256 keyed by the code over a role label, the server's and the client's
certificate fingerprints and the client's nonce; a box in the middle that shows either side
its own certificate changes a fingerprint, so it cannot give or pass on a matching proof
without the code.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Any

from engines.config.profiles import check_name
from engines.errors import ConfigError

ALPHABET = "23456789ABCDEFGHJKMNPQRSTUVWXYZ"
CODE_LENGTH = 10
PROTOCOL = "traylm-pair-v1"


def new_code() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))


def shown(code: str) -> str:
    """The code as a person reads and types it: ABCDE-FGHJK."""
    half = len(code) // 2
    return f"{code[:half]}-{code[half:]}"


def normalise(typed: str) -> str | None:
    """The code a person typed (any case, spaces or dashes), or None when it cannot be one."""
    code = "".join(typed.split()).replace("-", "").upper()
    if len(code) != CODE_LENGTH or any(c not in ALPHABET for c in code):
        return None
    return code


def proof(code: str, role: str, server_fp: str, client_fp: str, nonce: str) -> str:
    """``role``: "client" (the box that joins) or "server" (the box that showed the code)."""
    message = "|".join((PROTOCOL, role, server_fp, client_fp, nonce)).encode()
    return hmac.new(code.encode(), message, hashlib.sha256).hexdigest()


def matches(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def parse_request(body: Mapping[str, Any]) -> tuple[str, int, str, str, str]:
    """The joining box's fields, checked; ConfigError names what is wrong."""
    if body.get("protocol") != PROTOCOL:
        raise ConfigError(
            f"the other box speaks pairing protocol {body.get('protocol')!r}, this one "
            f"{PROTOCOL!r}; update traylm on the older box"
        )
    name, port = body.get("name"), body.get("port")
    texts = [body.get(k) for k in ("cert", "nonce", "proof")]
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ConfigError("the pairing request's port must be 1-65535")
    if not all(isinstance(t, str) and 0 < len(t) < 16384 for t in texts):
        raise ConfigError("the pairing request needs cert, nonce and proof as text")
    cert, nonce, proof = (str(t) for t in texts)
    return check_name(text(name), "box"), port, cert, nonce, proof


def text(value: object) -> str:
    return value if isinstance(value, str) else repr(value)
