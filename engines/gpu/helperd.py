"""traylm-gpud: the privileged helper that owns fan curves and power limits.

It runs as root (systemd system unit, installers/linux/traylm-gpud.service) and listens on a unix
socket owned by root:traylm, mode 0660, so only members of the ``traylm`` group can talk to it.
The protocol (engines/gpu/protocol.py) is one strict JSON object per line, rate limited per
connection; every value is checked against the card before it is applied
(engines/gpu/helper_core.py).

It runs the fan-curve loop itself, so fans stay safe while the daemon is gone, and gives control
back — every fan to the firmware, every power limit to its default — on exit, on SIGTERM/SIGINT/
SIGHUP, on an uncaught error, and (``--restore-all``) from the unit's ExecStopPost hook, which
also covers a SIGKILL. Settings sent without ``persist`` are leases of the connection that sent
them: when that client goes away (or stays silent past ``--lease-timeout-s``) they are released.

    traylm-gpud [--socket PATH] [--group traylm] [--backend nvml|sim[:N]] [--state-dir DIR]
    traylm-gpud --restore-all

Without root (development and tests) the group and ownership steps are skipped with a warning
and the socket is private to the user (0600).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import grp
import itertools
import logging
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engines import __version__
from engines.errors import ConfigError, TraylmError
from engines.gpu.backend import GPUBackend
from engines.gpu.fans import curve_from_mapping
from engines.gpu.helper_core import HelperCore
from engines.gpu.protocol import MAX_LINE_BYTES, ProtocolError, Request, ok, parse_request, refused

log = logging.getLogger("traylm-gpud")

DEFAULT_SOCKET = "/run/traylm-gpud/traylm-gpud.sock"
DEFAULT_STATE_DIR = "/var/lib/traylm-gpud"
DEFAULT_GROUP = "traylm"
MAX_CLIENTS = 16


class TokenBucket:
    """``rate_per_s`` requests a second on average, bursts up to ``burst``."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens = burst
        self._last = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class HelperServer:
    """The socket server and the fan loop around one HelperCore. Usable in-process (the daemon
    runs one on the simulator) or as the traylm-gpud process (``main``)."""

    def __init__(
        self,
        core: HelperCore,
        socket_path: Path,
        *,
        group: str | None = None,
        interval_s: float = 1.0,
        lease_timeout_s: float = 30.0,
        requests_per_s: float = 10.0,
        writes_per_s: float = 2.0,
    ) -> None:
        self.core = core
        self.socket_path = socket_path
        self.group = group
        self.interval_s = interval_s
        self.lease_timeout_s = lease_timeout_s
        self.requests_per_s = requests_per_s
        self.writes_per_s = writes_per_s
        self._server: asyncio.AbstractServer | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._clients: dict[int, asyncio.Task[None]] = {}
        self._ids = itertools.count(1)
        self.failed: BaseException | None = None
        self.stopped = asyncio.Event()
        self._ops: dict[str, Callable[[Request, int], Any]] = {
            "status": self._status,
            "apply_curve": self._apply_curve,
            "restore_fans": self._restore_fans,
            "apply_power": self._apply_power,
            "restore_power": self._restore_power,
            "apply_clocks": self._apply_clocks,
            "restore_clocks": self._restore_clocks,
        }
        """op → handler(request, client id); runs in a worker thread (HelperCore blocks)."""

    async def start(self) -> None:
        problems = await asyncio.to_thread(self.core.start)
        for line in problems:
            self.core.warnings.append(line)
        self._prepare_socket_path()
        self._server = await asyncio.start_unix_server(
            self._serve_client, path=str(self.socket_path), limit=MAX_LINE_BYTES + 2
        )
        self._secure_socket()
        self._loop_task = asyncio.create_task(self._fan_loop(), name="traylm-gpud fan loop")
        log.info(
            "traylm-gpud %s listening on %s (backend %s)",
            __version__,
            self.socket_path,
            self.core.backend.name,
        )

    async def stop(self) -> list[str]:
        """Stop serving and give every fan and power limit back. Returns restore failures."""
        if self._server is not None:
            self._server.close()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in list(self._clients.values()):
            task.cancel()
        for task in list(self._clients.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        failures = await asyncio.to_thread(self.core.restore_all)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.stopped.set()
        return failures

    # ----------------------------------------------------------------- socket

    def _prepare_socket_path(self) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # stale socket of a helper that died
            else:
                raise TraylmError(f"another traylm-gpud already listens on {path}")
            finally:
                probe.close()

    def _secure_socket(self) -> None:
        """root:GROUP 0660 as root; private (0600) without a group (in-process) or without root."""
        path = str(self.socket_path)
        if self.group is None:
            self.socket_path.chmod(0o600)
            return
        if os.geteuid() != 0:
            self.socket_path.chmod(0o600)
            log.warning(
                "not running as root: group and ownership checks skipped; the socket %s is "
                "private to this user and NVML writes may be refused",
                path,
            )
            return
        group = self.group
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ConfigError(
                f"group {group!r} does not exist; create it with `groupadd --system {group}` "
                f"and add users with `usermod -aG {group} USER`"
            ) from None
        os.chown(path, 0, gid)
        self.socket_path.chmod(0o660)

    # ----------------------------------------------------------------- clients

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        cid = next(self._ids)
        task = asyncio.current_task()
        if len(self._clients) >= MAX_CLIENTS:
            writer.write(refused(None, "busy", f"more than {MAX_CLIENTS} clients"))
            writer.close()
            return
        assert task is not None
        self._clients[cid] = task
        peer = _peer(writer)
        log.info("client %d connected (%s)", cid, peer)
        requests = TokenBucket(self.requests_per_s, self.requests_per_s * 2)
        writes = TokenBucket(self.writes_per_s, self.writes_per_s * 3)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), self.lease_timeout_s)
                except TimeoutError:
                    log.info("client %d silent for %.0f s: closing", cid, self.lease_timeout_s)
                    break
                except ValueError:  # longer than the stream limit
                    writer.write(refused(None, "bad_request", f"line over {MAX_LINE_BYTES} bytes"))
                    break
                if not line:
                    break
                writer.write(await self._answer(line, cid, requests, writes))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._clients.pop(cid, None)
            await asyncio.to_thread(self.core.release, cid)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()
            log.info("client %d gone", cid)

    async def _answer(
        self, line: bytes, cid: int, requests: TokenBucket, writes: TokenBucket
    ) -> bytes:
        rid = None
        try:
            req = parse_request(line.strip())
            rid = req.id
            if not requests.take() or (req.op != "status" and not writes.take()):
                return refused(rid, "rate_limited", "too many requests; slow down and retry")
            result = await asyncio.to_thread(self._execute, req, cid)
            return ok(rid, result)
        except ProtocolError as exc:
            log.warning("client %d: refused: %s", cid, exc.message)
            return refused(rid, exc.code, exc.message)
        except TraylmError as exc:
            log.warning("client %d: refused: %s", cid, exc.message)
            return refused(rid, exc.code, exc.message)

    def _execute(self, req: Request, cid: int) -> Any:
        handler = self._ops.get(req.op)
        if handler is None:  # parse_request checked the op against protocol.OPS already
            raise ProtocolError(f"unknown op {req.op!r}")
        return handler(req, cid)

    def _status(self, req: Request, cid: int) -> Any:
        return {**self.core.status(), "version": __version__, "pid": os.getpid()}

    def _apply_curve(self, req: Request, cid: int) -> Any:
        assert req.curve is not None
        curve = curve_from_mapping(req.curve)
        result = self.core.apply_curve(
            req.gpu, curve, req.fans, persist=req.persist, owner=None if req.persist else cid
        )
        log.info("client %d: fan curve on %s fans %s", cid, req.gpu, result["fans"])
        return result

    def _restore_fans(self, req: Request, cid: int) -> Any:
        return {"gpus": self.core.restore_fans(req.gpu)}

    def _apply_power(self, req: Request, cid: int) -> Any:
        assert req.limit_mw is not None
        result = self.core.apply_power(
            req.gpu, req.limit_mw, persist=req.persist, source=req.source, owner=cid
        )
        log.info("client %d: power limit %s on %s", cid, req.limit_mw, req.gpu)
        return result

    def _restore_power(self, req: Request, cid: int) -> Any:
        return {"gpus": self.core.restore_power(req.gpu, req.source)}

    def _apply_clocks(self, req: Request, cid: int) -> Any:
        assert req.min_mhz is not None and req.max_mhz is not None
        result = self.core.apply_clocks(
            req.gpu, req.clock, req.min_mhz, req.max_mhz, persist=req.persist, owner=cid
        )
        log.info(
            "client %d: %s clock locked %s-%s MHz on %s",
            cid,
            req.clock,
            req.min_mhz,
            req.max_mhz,
            req.gpu,
        )
        return result

    def _restore_clocks(self, req: Request, cid: int) -> Any:
        return {"gpus": self.core.restore_clocks(req.gpu, req.clock)}

    # ----------------------------------------------------------------- fan loop

    async def _fan_loop(self) -> None:
        try:
            while True:
                await asyncio.to_thread(self.core.tick, _clock_gap_s())
                await asyncio.sleep(self.interval_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # boundary: an unexpected error must not leave fans manual
            log.exception("fan loop failed; restoring automatic fans")
            self.failed = exc
            await asyncio.to_thread(self.core.restore_all)
            self.stopped.set()


def _clock_gap_s() -> float | None:
    """CLOCK_BOOTTIME counts suspended time, CLOCK_MONOTONIC does not: the gap grows on resume."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return None
    return time.clock_gettime(boottime) - time.monotonic()


def _peer(writer: asyncio.StreamWriter) -> str:
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return "unknown peer"
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", creds)
    except OSError:
        return "unknown peer"
    return f"pid {pid} uid {uid} gid {gid}"


# --------------------------------------------------------------------------- process entry


def make_backend(spec: str, *, sim_state: Path | None = None) -> GPUBackend:
    """``nvml`` or ``sim[:N]`` (N simulated RTX 4090s)."""
    if spec == "nvml":
        from engines.gpu.nvml import NVMLBackend

        return NVMLBackend()
    name, _, count = spec.partition(":")
    if name == "sim":
        from engines.gpu.sim import SimulatedBackend

        try:
            n = int(count or "2")
        except ValueError:
            n = -1
        if not 1 <= n <= 8:
            raise ConfigError(f"--backend {spec}: N must be 1-8 (e.g. sim:2)")
        return SimulatedBackend(n, state_path=sim_state)
    raise ConfigError(f"--backend {spec!r}: use nvml or sim[:N]")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="traylm-gpud", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--socket", default=DEFAULT_SOCKET, help=f"unix socket (default {DEFAULT_SOCKET})"
    )
    p.add_argument("--group", default=DEFAULT_GROUP, help="group allowed to connect (root only)")
    p.add_argument("--backend", default="nvml", help="nvml (default) or sim[:N] for testing")
    p.add_argument("--state-dir", help=f"saved settings (default {DEFAULT_STATE_DIR} as root)")
    p.add_argument("--interval-s", type=float, default=1.0, help="fan loop period (0.5-3 s)")
    p.add_argument("--lease-timeout-s", type=float, default=30.0, help="silent client timeout")
    p.add_argument("--sim-state", help="sim backend: write its control state to this JSON file")
    p.add_argument(
        "--restore-all",
        action="store_true",
        help="give every fan, power limit and clock lock back, then exit",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        sys.exit(asyncio.run(_main(args)))
    except TraylmError as exc:
        print(f"traylm-gpud: {exc.message}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


async def _main(args: argparse.Namespace) -> int:
    if not 0.5 <= args.interval_s <= 3:
        raise ConfigError(
            "--interval-s must be 0.5-3 s (faster polling stutters other GPU programs)"
        )
    sim_state = Path(args.sim_state) if args.sim_state else None
    backend = make_backend(args.backend, sim_state=sim_state)
    if args.restore_all:
        failures = await asyncio.to_thread(HelperCore(backend).restore_all, everything=True)
        print(
            "traylm-gpud: "
            + (
                "; ".join(failures)
                if failures
                else "fans automatic, power limits default, clocks unlocked"
            )
        )
        return 1 if failures else 0
    state_dir = Path(args.state_dir) if args.state_dir else _default_state_dir()
    core = HelperCore(backend, state_dir)
    server = HelperServer(
        core,
        Path(args.socket),
        group=args.group,
        interval_s=args.interval_s,
        lease_timeout_s=args.lease_timeout_s,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        print(f"traylm-gpud: ready on {args.socket}", file=sys.stderr, flush=True)
        waiter = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(server.stopped.wait())
        await asyncio.wait({waiter, failed}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        failed.cancel()
    finally:
        failures = await server.stop()
        log.info("stopped: %s", "; ".join(failures) or "fans automatic, power limits default")
    return 1 if server.failed is not None or failures else 0


def _default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path(DEFAULT_STATE_DIR)
    from engines.config.sections import Paths

    return Paths.from_env().state_dir / "gpud"


if __name__ == "__main__":
    main()
