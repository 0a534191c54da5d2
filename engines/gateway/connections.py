"""The gateway's listening socket and what arrives on it before a request exists.

Malformed HTTP (a port scanner, a client speaking TLS to a plain port) is answered 400 by
aiohttp, which logs each one as an ERROR with a traceback: here it is one INFO line.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError


class MalformedRequestFilter(logging.Filter):
    """Turns aiohttp's "Error handling request" traceback for a request it could not parse into
    one INFO line naming the peer and what was wrong. Errors of the gateway itself keep their
    level and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.msg = "refused a malformed request from %s: %s"
            record.args = (peer, exc.message or type(exc).__name__)
            record.exc_info, record.exc_text = None, None
        return True


def http_logger() -> logging.Logger:
    """The logger for aiohttp's request handlers (``AppRunner(logger=...)``), with the
    malformed-request filter."""
    logger = logging.getLogger("engines.gateway.http")
    if not any(isinstance(f, MalformedRequestFilter) for f in logger.filters):
        logger.addFilter(MalformedRequestFilter())
    return logger
