"""Process groups: free loopback ports, group kill with verification, and the orphan reaper.

Engines run in their own session (``start_new_session=True``), so their process group id equals
the leader's pid. vLLM's workers (``VLLM::EngineCore``, ``VLLM::Worker``) stay in that group, so
killing the group reaches them even when the leader was SIGKILLed. Descendants are also tracked
by pid (with their start time, so a reused pid is never killed by mistake).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from engines.config.tomlfile import write_bytes_atomic

log = logging.getLogger(__name__)

EXIT_POLL_S = 0.05
SETTLE_S = 2.0  # what the exit and the pipes' end of a process traylm ended take to be seen
"""How often an exit code is looked at where no pidfd tells it (not Linux, a kernel before 5.3)."""


FD_RESERVE = 256
"""Open files kept for everything but client connections (engine pipes, logs, SQLite, scans)."""
MAX_CONNECTIONS_CEILING = 1 << 20


def raise_open_files_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit (a default soft limit of
    1024 is what a thousand idle connections exhaust). Returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else MAX_CONNECTIONS_CEILING
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_CONNECTIONS_CEILING if soft == resource.RLIM_INFINITY else soft


def connections_for(open_files: int) -> int:
    """Client connections an open-files limit leaves room for: each relayed request holds two
    descriptors (the client's and the engine's), after a reserve for everything else."""
    return max(16, (open_files - FD_RESERVE) // 2)


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_holder(host: str, port: int) -> str | None:
    """Describe the process listening on ``port`` ("pid 4242 (python3 -m http.server)"), or
    None when it cannot be told (another user's process, or no permission)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return describe_pid(c.pid)
    return None


def describe_pid(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline()[:4]) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:80]})"


@dataclass(frozen=True)
class TrackedProcess:
    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> TrackedProcess | None:
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.NoSuchProcess:
            return None

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.create_time) < 0.01 and (
                proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.NoSuchProcess:
            return False


def descendants(pid: int) -> list[TrackedProcess]:
    """The processes below ``pid``, children first. On Linux read from the kernel's list of
    each thread's children (the engine's own tree only), so a scan while an engine serves does
    not read every process on the machine; elsewhere psutil's scan of all processes."""
    if not _proc_children_listed():
        return _descendants_by_scan(pid)
    out = []
    below, seen = [pid], {pid}
    while below:
        for child in _child_pids(below.pop(0)):
            if child in seen:  # a pid reused meanwhile: never walk a loop
                continue
            seen.add(child)
            below.append(child)
            if (tracked := TrackedProcess.of(child)) is not None:
                out.append(tracked)
    return out


@functools.cache
def _proc_children_listed() -> bool:
    """Whether this kernel lists a thread's children (/proc/PID/task/TID/children)."""
    return Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children").exists()


def _child_pids(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (none once it is gone)."""
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return []
    out: list[int] = []
    for thread in threads:
        try:  # a thread that ended meanwhile has no file any more
            text = (thread / "children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.extend(int(word) for word in text.split())
    return out


def _descendants_by_scan(pid: int) -> list[TrackedProcess]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            out.append(TrackedProcess(child.pid, child.create_time()))
    return out


async def exit_code(proc: asyncio.subprocess.Process, timeout_s: float) -> int | None:
    """The leader's exit code as soon as it has exited, or None after ``timeout_s``.

    Woken by the exit itself: the process's pidfd (Linux ≥ 5.3) turns readable when it ends,
    so a wait costs no wake-ups however long it lasts. Where pidfds are not available the exit
    code is looked at every ``EXIT_POLL_S``.

    Not ``proc.wait()``: on Python 3.11 that also waits until the stdout pipe closes, and an
    engine's children (``VLLM::EngineCore``) keep it open after the leader died. The exit code
    is read from the pidfd without reaping (the child watcher reaps and sets ``returncode``).
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # reaped already (its code is on its way), or no pidfds
        return await _polled_exit_code(proc, timeout_s)
    try:
        if not await _readable(pidfd, timeout_s):
            return proc.returncode
        code = _exit_status(pidfd)
    finally:
        os.close(pidfd)
    if proc.returncode is not None:
        return proc.returncode
    if code is not None:
        return code
    return await _polled_exit_code(proc, timeout_s)  # being reaped: its code comes at once


async def settled(proc: asyncio.subprocess.Process, timeout_s: float = SETTLE_S) -> None:
    """Wait, bounded, until asyncio has seen ``proc``'s exit and its pipes close, which closes
    its transport. A process ended by traylm (its group gone, so nothing holds its pipes) is
    waited for so: otherwise its transport may still be open when the event loop closes (the
    daemon stopping right after a stop), and is left to the garbage collector with an
    "unclosed transport" ResourceWarning. ``proc.wait()`` is the public way: on Python 3.11 it
    returns once the exit and the pipes' ends were both seen."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout_s)


async def _readable(fd: int, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        async with asyncio.timeout(timeout_s):
            await ready
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True


def _exit_status(pidfd: int) -> int | None:
    """The exit code of an exited child (negative: the signal that ended it) as asyncio gives
    it, left for the child watcher to reap; None once it is reaped or not a child."""
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)  # CLD_KILLED, CLD_DUMPED: ended by that signal


async def _polled_exit_code(proc: asyncio.subprocess.Process, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while proc.returncode is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(EXIT_POLL_S, left))
    return proc.returncode


def group_alive(pgid: int) -> bool:
    """True while any process (zombies excluded) is in process group ``pgid``."""
    if pgid <= 1:
        raise ValueError(f"not an engine process group: {pgid}")
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_tracked(processes: list[TrackedProcess], sig: signal.Signals) -> None:
    for p in processes:
        if p.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, sig)


def vitals(pid: int, tracked: Iterable[TrackedProcess]) -> tuple[float | None, list[int]]:
    """The leader's CPU seconds so far (None once it is gone), and the pids of the engine's
    processes that are stopped (SIGSTOP: they run again only after SIGCONT)."""
    cpu_s: float | None = None
    stopped: list[int] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        leader = psutil.Process(pid)
        times = leader.cpu_times()
        cpu_s = times.user + times.system
        if leader.status() == psutil.STATUS_STOPPED:
            stopped.append(pid)
    for p in tracked:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.pid != pid and psutil.Process(p.pid).status() == psutil.STATUS_STOPPED:
                stopped.append(p.pid)
    return cpu_s, stopped


def is_stopped(pid: int) -> bool:
    """True when the process is stopped (SIGSTOP)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.NoSuchProcess:
        return False


def survivors(pgid: int, tracked: list[TrackedProcess]) -> list[int]:
    alive = [p.pid for p in tracked if p.alive()]
    if group_alive(pgid) and pgid not in alive:
        alive.append(pgid)
    return alive


Trouble = Callable[[str, BaseException], None]
"""Told when a check of the processes failed (it is retried): (what failed, the error)."""


async def end_group(
    proc: asyncio.subprocess.Process,
    tracked: list[TrackedProcess],
    *,
    grace_s: float,
    trouble: Trouble,
) -> list[int]:
    """End an engine's process group: SIGTERM the leader and wait (60 % of ``grace_s``), SIGTERM
    the group and every tracked descendant and wait (the rest), then SIGKILL them all and check.
    No grace for what cannot use it: a stopped process (SIGSTOP; a SIGTERM would wait for a
    SIGCONT that never comes) is SIGKILLed first, and a stopped leader means SIGKILL for all at
    once. Returns the pids still alive after the SIGKILL (none, normally)."""
    pgid = proc.pid
    try:
        stopped = await asyncio.to_thread(vitals, pgid, tracked)
    except (OSError, psutil.Error) as exc:
        trouble("cannot read the state of the engine's processes", exc)
        stopped = (None, [])
    for pid in stopped[1]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if pgid not in stopped[1]:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            await exit_code(proc, grace_s * 0.6)
        signal_group(pgid, signal.SIGTERM)
        kill_tracked(tracked, signal.SIGTERM)
        if await _wait_gone(pgid, tracked, grace_s * 0.4, trouble):
            return []
    signal_group(pgid, signal.SIGKILL)
    kill_tracked(tracked, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    if await _wait_gone(pgid, tracked, 5.0, trouble):
        return []
    try:
        return await asyncio.to_thread(survivors, pgid, tracked)
    except (OSError, psutil.Error):
        return [pgid]


async def _wait_gone(
    pgid: int, tracked: list[TrackedProcess], timeout_s: float, trouble: Trouble
) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if not await asyncio.to_thread(survivors, pgid, tracked):
                return True
        except (OSError, psutil.Error) as exc:  # not known: look again
            trouble("cannot check that the engine's processes are gone", exc)
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.1)


@dataclass(frozen=True)
class EngineRecord:
    """What the reaper needs to find an engine's processes after the daemon died."""

    engine_id: str
    pgid: int
    leader: TrackedProcess
    tracked: tuple[TrackedProcess, ...] = ()


class PidRegistry:
    """engine-pids.json in the state dir: the live engines' process groups."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, EngineRecord]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        out: dict[str, EngineRecord] = {}
        for key, rec in raw.items():
            with contextlib.suppress(KeyError, TypeError):
                out[key] = EngineRecord(
                    rec["engine_id"],
                    int(rec["pgid"]),
                    TrackedProcess(**rec["leader"]),
                    tuple(TrackedProcess(**t) for t in rec.get("tracked", ())),
                )
        return out

    def put(self, record: EngineRecord) -> None:
        records = self.read()
        records[record.engine_id] = record
        self._write(records)

    def drop(self, engine_id: str) -> None:
        records = self.read()
        if records.pop(engine_id, None) is not None:
            self._write(records)

    def clear(self) -> None:
        """Forget every engine (after the reaper killed what was left)."""
        self._write({})

    def _write(self, records: dict[str, EngineRecord]) -> None:
        data = {k: asdict(v) for k, v in records.items()}
        write_bytes_atomic(self.path, json.dumps(data, indent=1).encode(), mode=0o600)


KILLED_GONE_S = 5.0
"""How long ``reap_orphans`` waits for SIGKILLed processes to be gone (or zombies)."""


def reap_orphans(registry: PidRegistry, *, grace_s: float = 5.0) -> list[str]:
    """Kill engine process groups left behind by a daemon that died, and wait (bounded) until
    they are gone. Returns one line per engine reaped. Only processes whose pid *and* start
    time match the record are touched."""
    reaped: list[str] = []
    for rec in registry.read().values():
        members = [p for p in (rec.leader, *rec.tracked) if p.alive()]
        if not members:
            continue
        leader_alive = rec.leader.alive()
        if leader_alive:
            signal_group(rec.pgid, signal.SIGTERM)
        kill_tracked(members, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.alive() for p in members):
            time.sleep(0.1)
        if leader_alive:
            signal_group(rec.pgid, signal.SIGKILL)
        kill_tracked(members, signal.SIGKILL)
        # a SIGKILL takes effect when the process next runs: on a loaded machine that is not at
        # once, and what follows (a new engine on the same port, GPU memory) needs them gone
        deadline = time.monotonic() + KILLED_GONE_S
        while time.monotonic() < deadline and any(p.alive() for p in members):
            time.sleep(0.02)
        reaped.append(
            f"{rec.engine_id}: killed {len(members)} orphaned process(es) of group {rec.pgid}"
        )
        log.warning("reaped orphaned engine %s (group %d)", rec.engine_id, rec.pgid)
    registry.clear()
    return reaped
