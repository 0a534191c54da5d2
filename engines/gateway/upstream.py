"""Where the gateway sends a request: an engine of this box, an attached server, the remote
fallback or a paired box, with the headers and TLS that reach it."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Upstream:
    """Where a request goes: an engine's loopback URL, an attached server's, the remote
    fallback's base URL (``remote``), or a paired box's peer listener (``box``)."""

    name: str  # engine id, shown in X-Traylm-Engine
    base_url: str  # without the /v1 suffix
    headers: Mapping[str, str]
    remote: bool = False
    """The cloud API of engines/remote/ (the remote fallback), not a paired box."""
    box: str = ""
    """The paired box whose gateway serves it (engines/peers/replicas.py): its peer listener
    over mutual TLS (``tls``); "" for this box's own engines and servers."""
    tls: ssl.SSLContext | None = None
    """The TLS context of an https upstream (a paired box's: this box's certificate, the
    box's pinned one); None: the system's CAs."""
    model_name: str | None = None
    """The name the upstream knows the model by, when it is not the one requested (an
    attached server asked for by its attach name): the route rewrites the body's ``model``."""
