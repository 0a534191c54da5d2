"""What the supervisor asks a running engine over HTTP: is it healthy (a probe that tells an
engine that does not answer from a daemon that could not ask), how far its token counters are,
and the sleep and wake actions of vLLM's sleep mode."""

from __future__ import annotations

import errno
from collections.abc import Callable

import aiohttp

from engines.errors import EngineError
from engines.runtime.liveness import Health, progress_counter

SLEEP_TIMEOUT_S = 120.0  # a sleep or wake moves the weights between GPU and host RAM
LOCAL_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""Errors that say the daemon is short of resources, not that the engine is unwell."""

Trouble = Callable[[str, BaseException], None]
"""Told what the supervisor could not do and why (it goes on and retries)."""


async def probe(
    http: aiohttp.ClientSession, base_url: str | None, path: str, trouble: Trouble
) -> Health:
    """OK: 200. BAD: another answer. SILENT: no answer in time. UNKNOWN: the daemon itself
    could not ask (out of descriptors), which says nothing about the engine; ``trouble`` is
    told so."""
    try:
        async with http.get(f"{base_url}{path}") as resp:
            await resp.read()
            return Health.OK if resp.status == 200 else Health.BAD
    except aiohttp.ClientConnectorError as exc:
        return _probe_failed(path, exc.os_error, trouble)
    except OSError as exc:
        return _probe_failed(path, exc, trouble)
    except (aiohttp.ClientError, TimeoutError):
        return Health.SILENT


def _probe_failed(path: str, exc: OSError, trouble: Trouble) -> Health:
    if exc.errno in LOCAL_RESOURCE_ERRNOS:
        trouble(f"cannot probe {path}", exc)
        return Health.UNKNOWN
    return Health.SILENT


async def token_counters(
    http: aiohttp.ClientSession, metrics_url: str | None, engine: str = ""
) -> float | None:
    """The engine's token counters from its Prometheus route (``ManagedEngine.metrics_url``:
    None for an engine without one, which is never polled), or None."""
    if metrics_url is None:
        return None
    try:
        async with http.get(metrics_url) as resp:
            if resp.status != 200:
                return None
            return progress_counter(await resp.text(errors="replace"), engine)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


async def post_action(base_url: str | None, path: str, engine_id: str) -> None:
    """POST ``path`` (sleep, wake) and expect 200 within SLEEP_TIMEOUT_S. Raises EngineError
    with the engine's answer, or saying it did not answer."""
    timeout = aiohttp.ClientTimeout(total=SLEEP_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(f"{base_url}{path}") as resp,
        ):
            text = await resp.text()
            if resp.status != 200:
                raise EngineError(
                    f"engine {engine_id!r} answered {resp.status} to {path}: {text[:200]}"
                )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise EngineError(
            f"engine {engine_id!r} did not answer {path} ({type(exc).__name__})"
        ) from exc
