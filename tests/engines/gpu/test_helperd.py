"""traylm-gpud as a real process on the simulated backend: its protocol refuses bad requests,
and it gives the fans back to the firmware on SIGTERM and when its client vanishes.

``--sim-state`` makes the simulated driver write its control state (fan modes, power limits) to a
file after every write, so the test can see what the helper left behind after it exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import grp
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engines.errors import HelperRefused
from engines.gpu.helper_core import HelperCore
from engines.gpu.helperd import HelperServer
from engines.gpu.protocol import OPS, ProtocolError, parse_request
from engines.gpu.sim import SimulatedBackend, sim_uuid

GPU0, GPU1 = sim_uuid(0), sim_uuid(1)
FULL = {"points": [[30, 100], [100, 100]]}


# --------------------------------------------------------------------------- parser (in-process)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"op": "format_disk"}', "unknown op"),
        (b'{"op": "status", "sudo": true}', "unknown keys"),
        (b'{"op": "status", "op": "status"}', "duplicate key"),
        (b'{"op": "apply_power", "gpu": "' + GPU0.encode() + b'", "limit_mw": NaN}', "NaN"),
        (
            b'{"op": "apply_power", "gpu": "' + GPU0.encode() + b'", "limit_mw": 3e5}',
            "whole number",
        ),
        (
            b'{"op": "apply_power", "gpu": "' + GPU0.encode() + b'", "limit_mw": true}',
            "whole number",
        ),
        (b'{"op": "apply_power", "gpu": "../etc", "limit_mw": 300000}', "GPU UUID"),
        (b'{"op": "apply_power", "gpu": "all", "limit_mw": 300000}', "GPU UUID"),
        (b'{"op": "apply_curve", "gpu": "' + GPU0.encode() + b'"}', "needs curve"),
        (
            b'{"op": "apply_curve", "gpu": "' + GPU0.encode() + b'", "curve": [], "persist": 1}',
            "curve must be",
        ),
        (b'{"op": "restore_power", "gpu": "all", "source": "root"}', "source must be"),
        (
            b'{"op": "apply_curve", "gpu": "' + GPU0.encode() + b'", "curve": {}, "fans": [0, 0]}',
            "distinct",
        ),
        (b'{"op": "status", "id": -1}', "id must be"),
        (b" " * 20000, "longer than"),
    ],
)
def test_protocol_refusals(line: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_request(line)
    assert expected in err.value.message
    assert err.value.code == "bad_request"


def test_every_protocol_op_has_a_handler(tmp_path: Path) -> None:
    """The helper dispatches through one table; an op the parser accepts but the table lacks
    would reach clients as "unknown op"."""
    server = HelperServer(HelperCore(SimulatedBackend(1)), tmp_path / "s.sock")
    assert set(server._ops) == set(OPS)


def test_protocol_accepts_a_well_formed_request() -> None:
    req = parse_request(
        json.dumps(
            {"op": "apply_power", "id": 3, "gpu": GPU0, "limit_mw": 300000, "persist": True}
        ).encode()
    )
    assert (req.op, req.id, req.gpu, req.limit_mw, req.persist) == (
        "apply_power",
        3,
        GPU0,
        300000,
        True,
    )


# --------------------------------------------------------------------------- the real process


@dataclass
class Helper:
    proc: asyncio.subprocess.Process
    socket: Path
    sim_state: Path
    state_dir: Path

    def control(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.sim_state.read_text())
        return data


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.next_id = 0

    async def raw(self, line: bytes) -> dict[str, Any]:
        self.writer.write(line + b"\n")
        await self.writer.drain()
        answer: dict[str, Any] = json.loads(await asyncio.wait_for(self.reader.readline(), 10))
        return answer

    async def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        self.next_id += 1
        return await self.raw(json.dumps({"op": op, "id": self.next_id, **fields}).encode())

    def close(self) -> None:
        self.writer.close()


async def connect(helper: Helper) -> Conn:
    reader, writer = await asyncio.open_unix_connection(str(helper.socket), limit=1 << 20)
    return Conn(reader, writer)


async def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest.fixture
async def helper(tmp_path: Path) -> AsyncIterator[Helper]:
    sock = Path(f"/tmp/traylm-test-{os.getpid()}-{time.monotonic_ns()}.sock")
    sim_state = tmp_path / "sim-state.json"
    state_dir = tmp_path / "gpud"
    group = grp.getgrgid(os.getgid()).gr_name  # as root: exercises the chown/0660 path
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engines.gpu.helperd",
        "--socket",
        str(sock),
        "--backend",
        "sim:2",
        "--state-dir",
        str(state_dir),
        "--sim-state",
        str(sim_state),
        "--group",
        group,
        "--lease-timeout-s",
        "3",
        stderr=asyncio.subprocess.PIPE,
    )
    h = Helper(proc, sock, sim_state, state_dir)
    assert proc.stderr is not None
    while True:  # wait for the ready line (fail fast if it died)
        line = await asyncio.wait_for(proc.stderr.readline(), 20)
        assert line, "traylm-gpud exited before it was ready"
        if b"ready on" in line:
            break
    drain = asyncio.create_task(proc.stderr.read())
    yield h
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
    drain.cancel()
    sock.unlink(missing_ok=True)


async def test_socket_is_private_and_status_answers(helper: Helper) -> None:
    mode = helper.socket.stat().st_mode & 0o777
    assert mode in (0o600, 0o660)  # 0660 root:group as root, 0600 otherwise
    c = await connect(helper)
    answer = await c.ask("status")
    assert answer["ok"] and answer["id"] == 1
    result = answer["result"]
    assert result["backend"] == "simulated" and result["simulated"] is True
    assert {f["mode"] for f in result["fans"]} == {"auto"}
    c.close()


async def test_bad_requests_are_refused_and_nothing_is_applied(helper: Helper) -> None:
    c = await connect(helper)
    refusals = [
        await c.raw(b"{broken"),
        await c.raw(b'{"op": "apply_power", "gpu": "' + GPU0.encode() + b'", "limit_mw": "300"}'),
        await c.ask("apply_power", gpu=GPU0, limit_mw=100_000),  # under the card's 150 W
        await c.ask("apply_power", gpu=GPU0, limit_mw=900_000),  # over its 600 W
        await c.ask("apply_power", gpu="GPU-99999999-0000-0000-0000-000000000000", limit_mw=300000),
        await c.ask("apply_curve", gpu=GPU0, curve={"points": [[40, 5], [80, 100]]}),
        await c.ask("apply_curve", gpu=GPU0, curve={"points": [[80, 50], [40, 100]]}),
        await c.ask("apply_curve", gpu=GPU0, curve=FULL, fans=[7]),
    ]
    codes = [r["error"] for r in refusals]
    assert all(not r["ok"] for r in refusals)
    assert codes == [
        "bad_request",
        "bad_request",
        "power_limit_invalid",
        "power_limit_invalid",
        "gpu_not_found",
        "fan_curve_invalid",
        "fan_curve_invalid",
        "gpu_error",
    ]
    assert "150-600 W" in refusals[2]["message"] and "fan floor" in refusals[5]["message"]
    assert not helper.sim_state.exists()  # the simulated driver never saw a write
    assert (await c.ask("status"))["ok"]  # the connection survives refusals
    c.close()


async def test_rate_limit(helper: Helper) -> None:
    c = await connect(helper)
    answers = [await c.ask("restore_fans", gpu="all") for _ in range(12)]
    limited = [a for a in answers if not a["ok"]]
    assert limited and all(a["error"] == "rate_limited" for a in limited)
    assert answers[0]["ok"]
    c.close()


async def test_sigterm_restores_automatic_fans_and_default_power(helper: Helper) -> None:
    c = await connect(helper)
    assert (await c.ask("apply_curve", gpu=GPU0, curve=FULL, persist=True))["ok"]
    assert (await c.ask("apply_power", gpu=GPU1, limit_mw=300_000, persist=True))["ok"]
    state = helper.control()
    assert all(f["manual"] for f in state[GPU0]["fans"])
    assert state[GPU1]["power_limit_mw"] == 300_000
    helper.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(helper.proc.wait(), 10) == 0
    state = helper.control()
    assert not any(f["manual"] for g in state.values() for f in g["fans"])
    assert state[GPU1]["power_limit_mw"] == 450_000
    assert not helper.socket.exists()
    saved = json.loads((helper.state_dir / "state.json").read_text())
    assert len(saved["items"]) == 3  # kept on disk: re-applied at the next start
    c.close()


async def test_client_vanishing_releases_its_leases(helper: Helper) -> None:
    c = await connect(helper)
    assert (await c.ask("apply_curve", gpu=GPU0, curve=FULL))["ok"]  # no persist: a lease
    assert (await c.ask("apply_power", gpu=GPU0, limit_mw=200_000))["ok"]
    assert all(f["manual"] for f in helper.control()[GPU0]["fans"])
    c.writer.transport.abort()  # the client dies without a goodbye

    def released() -> bool:
        g = helper.control()[GPU0]
        return not any(f["manual"] for f in g["fans"]) and g["power_limit_mw"] == 450_000

    await wait_until(released)
    assert helper.proc.returncode is None  # the helper itself keeps running


async def test_silent_client_times_out_and_is_released(helper: Helper) -> None:
    c = await connect(helper)
    assert (await c.ask("apply_curve", gpu=GPU1, curve=FULL))["ok"]
    assert all(f["manual"] for f in helper.control()[GPU1]["fans"])
    # no heartbeat for longer than --lease-timeout-s 3
    await wait_until(lambda: not any(f["manual"] for f in helper.control()[GPU1]["fans"]), 10)
    c.close()


async def test_second_helper_on_the_same_socket_is_refused(helper: Helper, tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engines.gpu.helperd",
        "--socket",
        str(helper.socket),
        "--backend",
        "sim:1",
        "--state-dir",
        str(tmp_path / "other"),
        "--group",
        grp.getgrgid(os.getgid()).gr_name,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 1
    assert b"already listens" in err


async def test_restore_all_command(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engines.gpu.helperd",
        "--restore-all",
        "--backend",
        "sim:2",
        "--sim-state",
        str(tmp_path / "s.json"),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0 and b"fans automatic" in out
    state = json.loads((tmp_path / "s.json").read_text())
    assert len(state) == 2  # every fan of every GPU was handed back, not only touched ones


# --------------------------------------------------------------------------- clock locks


def locks(helper: Helper, gpu: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = helper.control()[gpu]["clock_locks"]
    return found


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"clock": "core", "min_mhz": 210, "max_mhz": 900}, "clock must be one of sm, memory"),
        ({"clock": "sm", "min_mhz": 210}, "needs max_mhz"),
        ({"clock": "sm", "min_mhz": 210, "max_mhz": 1.5e3}, "whole number of MHz"),
        ({"clock": "sm", "min_mhz": 210, "max_mhz": 9000}, "outside the sm clocks"),
    ],
)
async def test_bad_clock_locks_are_refused(
    helper: Helper, fields: dict[str, Any], expected: str
) -> None:
    c = await connect(helper)
    answer = await c.ask("apply_clocks", gpu=GPU0, **fields)
    assert not answer["ok"] and expected in answer["message"]
    assert (await c.ask("status"))["result"]["clocks"] == []
    c.close()


async def test_sigterm_unlocks_clocks(helper: Helper) -> None:
    c = await connect(helper)
    answer = await c.ask(
        "apply_clocks", gpu=GPU0, clock="sm", min_mhz=210, max_mhz=1500, persist=True
    )
    assert answer["ok"], answer
    answer = await c.ask(
        "apply_clocks", gpu=GPU1, clock="memory", min_mhz=405, max_mhz=5001, persist=True
    )
    assert answer["ok"], answer
    assert locks(helper, GPU0) == {"sm": [210, 1500]}
    assert [x["domain"] for x in (await c.ask("status"))["result"]["clocks"]] == ["sm", "memory"]
    helper.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(helper.proc.wait(), 10) == 0
    assert locks(helper, GPU0) == {} and locks(helper, GPU1) == {}
    saved = json.loads((helper.state_dir / "state.json").read_text())
    assert [i["kind"] for i in saved["items"]] == ["clock", "clock"]  # re-applied at next start
    c.close()


async def test_client_vanishing_unlocks_its_clocks(helper: Helper) -> None:
    """The daemon holds its locks as leases: when it dies, they go."""
    c = await connect(helper)
    assert (await c.ask("apply_clocks", gpu=GPU1, clock="sm", min_mhz=210, max_mhz=1200))["ok"]
    assert locks(helper, GPU1) == {"sm": [210, 1200]}
    c.writer.transport.abort()
    await wait_until(lambda: locks(helper, GPU1) == {})
    assert helper.proc.returncode is None


async def test_helper_killed_then_the_stop_hook_unlocks(helper: Helper) -> None:
    c = await connect(helper)
    assert (await c.ask("apply_clocks", gpu=GPU0, clock="sm", min_mhz=210, max_mhz=1500))["ok"]
    helper.proc.kill()  # a crash: no restore of its own
    await helper.proc.wait()
    assert locks(helper, GPU0) == {"sm": [210, 1500]}  # the card keeps the lock
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engines.gpu.helperd",
        "--restore-all",
        "--backend",
        "sim:2",
        "--sim-state",
        str(helper.sim_state),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0 and b"clocks unlocked" in out
    assert locks(helper, GPU0) == {}
    c.close()


async def test_daemon_controls_lock_and_the_gpus_table_shows_it(helper: Helper) -> None:
    from engines.events.codec import Event
    from engines.events.gpu import ClockControl, GPUEntry, GPUOverview, GPUState
    from engines.gpu.cli import render_overview
    from engines.gpu.controls import GPUControls
    from engines.gpu.helper_client import HelperClient

    client = HelperClient(helper.socket)
    events: list[Event] = []
    controls = GPUControls(require_helper=lambda: client, publish=events.append, simulated=True)
    info = SimulatedBackend(2).open()[0]
    await controls.lock_clocks(info, "sm", 210, 1500, persist=False)
    assert client.status.clocks == (
        ClockControl(uuid=GPU0, domain="sm", min_mhz=210, max_mhz=1500),
    )
    overview = GPUOverview(
        backend="simulated",
        simulated=True,
        state=GPUState.OK,
        gpus=(GPUEntry(info=info),),
        helper=client.status,
    )
    assert "clock lock: GPU 0 sm 210-1500 MHz" in render_overview(overview)
    assert locks(helper, GPU0) == {"sm": [210, 1500]}
    assert await controls.reset_clocks("all") == [GPU0, GPU1]
    assert client.status.clocks == () and locks(helper, GPU0) == {}
    assert [getattr(e, "what", None) for e in events] == [
        "clock_lock",
        "clock_reset",
        "clock_reset",
    ]
    await client.stop()


@pytest.mark.slow
async def test_profiles_apply_in_order_and_a_refusal_leaves_defaults(helper: Helper) -> None:
    from engines.events.codec import Event
    from engines.gpu.controls import GPUControls
    from engines.gpu.efficiency import BUILTIN, resolve
    from engines.gpu.helper_client import HelperClient

    client = HelperClient(helper.socket)
    events: list[Event] = []
    controls = GPUControls(require_helper=lambda: client, publish=events.append, simulated=True)
    infos = SimulatedBackend(2).open()
    quiet, maximum = resolve(BUILTIN["quiet"], infos), resolve(BUILTIN["max"], infos)
    await asyncio.gather(  # two profiles in quick succession: one after the other
        controls.apply_profile("quiet", quiet), controls.apply_profile("max", maximum)
    )
    assert controls.in_force == {GPU0: "max", GPU1: "max"}
    assert controls.profile([GPU0, GPU1]) == "max"
    state = helper.control()
    assert state[GPU0]["clock_locks"] == {} and state[GPU0]["power_limit_mw"] == 450_000
    await controls.apply_profile("quiet", quiet)
    state = helper.control()
    assert state[GPU1]["clock_locks"] == {"sm": [210, 1512]}
    assert state[GPU1]["power_limit_mw"] == 270_000
    # the quiet curve holds the fans (a cool card is left to the firmware below its first point)
    assert {f.mode for f in client.status.fans if f.uuid == GPU1} == {"curve"}
    bad = (dataclasses.replace(quiet[0], sm_lock_mhz=(210, 9000)),)  # the helper refuses it
    with pytest.raises(HelperRefused, match="outside the sm clocks"):
        await controls.apply_profile("broken", bad)
    g0 = helper.control()[GPU0]  # handed back to the defaults: a known state
    assert g0["clock_locks"] == {} and g0["power_limit_mw"] == 450_000
    assert not any(f["manual"] for f in g0["fans"]) and GPU0 not in controls.in_force
    assert controls.profile([GPU0, GPU1]) is None  # GPU 1 still runs quiet: they differ
    assert {f.mode for f in client.status.fans if f.uuid == GPU0} == {"auto"}
    await client.stop()
