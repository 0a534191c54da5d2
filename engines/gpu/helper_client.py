"""The daemon's side of traylm-gpud: one persistent unix-socket connection, a heartbeat that
keeps its leases alive and its status fresh, and requests that raise ``HelperUnavailable`` (no
helper: everything stays read-only, and the status says how to install it) or ``HelperRefused``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import platformdirs

from engines.errors import HelperRefused, HelperUnavailable
from engines.events.codec import from_plain
from engines.events.gpu import ClockControl, FanControl, HelperStatus, PowerControl
from engines.gpu.protocol import MAX_LINE_BYTES, encode_request

log = logging.getLogger(__name__)

SOURCE_INSTALLER = Path(__file__).resolve().parents[2] / "installers" / "linux" / "install-gpud.sh"
"""The helper's installer in a source checkout (also an editable install: ``install.sh --dev``)."""


def installed_installer() -> Path:
    """Where install.sh keeps the helper's installer, beside the wheel it installed from."""
    return Path(platformdirs.user_data_dir("traylm")) / "gpud" / "install-gpud.sh"


def install_hint() -> str:
    """How to install traylm-gpud, naming the installer this computer has: the source
    checkout's, else the copy install.sh keeps; a wheel installed by pipx or uv has neither."""
    script = SOURCE_INSTALLER if SOURCE_INSTALLER.is_file() else installed_installer()
    how = (
        f"install it with `sudo bash {script}`"
        if script.is_file()
        else "install it with `sudo bash installers/linux/install-gpud.sh` from traylm's source "
        "(installing traylm with its install.sh keeps a copy in "
        f"{installed_installer().parent})"
    )
    return (
        f"fan curves and power limits need traylm-gpud, the small privileged helper: {how} "
        "(it creates the traylm group, installs and starts traylm-gpud.service), then log out "
        "and back in. Telemetry works without it."
    )


_STATUS_BY_CODE = {
    "gpu_not_found": 404,
    "gpu_no_permission": 403,
    "rate_limited": 429,
    "gpu_lost": 503,
    "gpu_unavailable": 503,
}


class HelperClient:
    def __init__(
        self,
        socket_path: Path,
        *,
        heartbeat_s: float = 5.0,
        timeout_s: float = 10.0,
        on_change: Callable[[HelperStatus], None] | None = None,
        label: str = "",
    ) -> None:
        self.socket_path = socket_path
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self._on_change = on_change
        self._label = label
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._next_id = 0
        self.status = HelperStatus(
            available=False,
            socket_path=str(socket_path),
            detail="not checked yet",
        )

    async def start(self) -> None:
        self.status = dataclasses.replace(self.status, install_hint=install_hint())
        self._task = asyncio.create_task(self._heartbeat(), name="traylm-gpud heartbeat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._close()

    async def refresh(self) -> HelperStatus:
        try:
            data = await self.request("status")
        except HelperUnavailable as exc:
            self._set(
                HelperStatus(
                    available=False,
                    socket_path=str(self.socket_path),
                    detail=exc.message,
                    install_hint=self.status.install_hint,
                )
            )
        else:
            self._set(self._parse_status(data))
        return self.status

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its result. Raises HelperUnavailable or HelperRefused."""
        async with self._lock:
            self._next_id += 1
            rid = self._next_id
            try:
                reader, writer = await self._connection()
                writer.write(encode_request(op, id=rid, **fields))
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), self.timeout_s)
                if not line:
                    raise ConnectionResetError("traylm-gpud closed the connection")
                answer = json.loads(line)
            except (OSError, TimeoutError, ValueError) as exc:
                await self._close()
                raise HelperUnavailable(_why(self.socket_path, exc)) from None
        if not isinstance(answer, dict) or answer.get("id") != rid:
            await self._close()
            raise HelperUnavailable("traylm-gpud answered out of turn; reconnecting")
        if not answer.get("ok"):
            code = str(answer.get("error", "helper_refused"))
            err = HelperRefused(f"traylm-gpud refused: {answer.get('message', code)}", code=code)
            err.http_status = _STATUS_BY_CODE.get(code, 400)
            raise err
        result = answer.get("result")
        return result if isinstance(result, dict) else {"result": result}

    # ----------------------------------------------------------------- internals

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._writer is not None and self._reader is not None and not self._writer.is_closing():
            return self._reader, self._writer
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(self.socket_path), limit=MAX_LINE_BYTES * 8),
            self.timeout_s,
        )
        self._reader, self._writer = reader, writer
        return reader, writer

    async def _close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _heartbeat(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.heartbeat_s)

    def _set(self, status: HelperStatus) -> None:
        changed = status != self.status
        self.status = status
        if changed and self._on_change is not None:
            self._on_change(status)

    def _parse_status(self, data: dict[str, Any]) -> HelperStatus:
        fans = tuple(from_plain(FanControl, f) for f in data.get("fans", []))
        power = tuple(from_plain(PowerControl, p) for p in data.get("power", []))
        clocks = tuple(
            ClockControl(
                uuid=str(c["uuid"]),
                domain=str(c["domain"]),
                min_mhz=int(c["mhz"][0]),
                max_mhz=int(c["mhz"][1]),
                persist=bool(c.get("persist", False)),
            )
            for c in data.get("clocks", [])
        )
        detail = f"traylm-gpud {data.get('version', '?')} (pid {data.get('pid', '?')})"
        if self._label:
            detail += f", {self._label}"
        return HelperStatus(
            available=True,
            socket_path=str(self.socket_path),
            detail=detail,
            version=str(data.get("version", "")),
            backend=str(data.get("backend", "")),
            simulated=bool(data.get("simulated", False)),
            fans=fans,
            power=power,
            clocks=clocks,
            warnings=tuple(str(w) for w in data.get("warnings", [])),
        )


def _why(path: Path, exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
        return f"traylm-gpud is not running (nothing listens on {path}); {install_hint()}"
    if isinstance(exc, PermissionError):
        return (
            f"no permission to use {path}: add yourself to the traylm group "
            f"(`sudo usermod -aG traylm {os.environ.get('USER', 'USER')}`), then log out and in"
        )
    if isinstance(exc, TimeoutError):
        return f"traylm-gpud at {path} did not answer in time"
    return f"traylm-gpud at {path} failed ({type(exc).__name__}: {exc})"
