"""The head box of a model across boxes: preflight of every box, the other ranks started over
the paired boxes' authenticated channel, and their supervision as one with this box's engine
(runtime.supervisor.Ranks): a rank that ends or a box that goes silent ends every rank, and
the supervisor restarts them together.

Peer routes on the other boxes: engines/multinode/routes.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from engines.config.profiles import ACROSS_BOXES_WARNING, Profile, profile_to_mapping
from engines.core.modelinfo import read_model_info
from engines.errors import PeerError, PreflightFailed, TraylmError
from engines.multinode.follower import local_digest
from engines.multinode.launch import RankPlan, has_rdma, rank_profile
from engines.multinode.network import Route, free_port_on, host_of, link_meaning, route_to
from engines.multinode.preflight import Facts, Finding, compare, port_closed
from engines.peers import link
from engines.peers.service import PeersFeature
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.supervisor import LogSink

log = logging.getLogger(__name__)

PROBE_BYTES = 4 << 20  # the bandwidth probe: large enough to leave TCP slow start behind
MISSES_BEFORE_SILENT = 3
RTT_SAMPLES = 3


class Channel(Protocol):
    """The head box's line to the other boxes' peer API (PeerChannel; tests give a fake)."""

    @property
    def box_name(self) -> str: ...

    def address(self, box: str) -> str:
        """The paired box's address (host:port); PeerNotFound when it is not paired."""
        ...

    async def call(
        self, box: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One request; PeerError naming the box and the fix when it fails."""
        ...

    async def upload(self, box: str, path: str, blob: bytes) -> None: ...

    async def round_trip(self, box: str) -> float:
        """Seconds of the shortest of a few small requests on one connection."""
        ...


class PeerChannel:
    """The paired boxes' mutual-TLS sessions (engines/peers/)."""

    def __init__(self, peers: PeersFeature) -> None:
        self._peers = peers

    @property
    def box_name(self) -> str:
        return self._peers.box_name

    def address(self, box: str) -> str:
        return self._peers.peer(box).address

    async def call(
        self, box: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        peer = self._peers.peer(box)
        try:
            async with (
                self._peers.session(box) as http,
                http.request(method, path, json=body) as resp,
            ):
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise link.explain(peer, exc) from None
        except ValueError:
            raise PeerError(f"box {box!r} gave an answer that is not JSON to {path}") from None
        if resp.status != 200 or not isinstance(data, dict):
            error = data.get("error") if isinstance(data, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise PeerError(f"{box}: {message or f'HTTP {resp.status} from {path}'}")
        return data

    async def round_trip(self, box: str) -> float:
        peer = self._peers.peer(box)
        times = []
        try:
            async with self._peers.session(box) as http:
                for _ in range(1 + RTT_SAMPLES):  # the first pays the TLS handshake
                    start = time.monotonic()
                    async with http.get("/peer/hello") as resp:
                        await resp.read()
                    times.append(time.monotonic() - start)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise link.explain(peer, exc) from None
        return min(times[1:])

    async def upload(self, box: str, path: str, blob: bytes) -> None:
        peer = self._peers.peer(box)
        try:
            async with self._peers.session(box) as http, http.post(path, data=blob) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise link.explain(peer, exc) from None


@dataclass
class Preflight:
    """What the head box found: every finding, and how the ranks meet."""

    findings: list[Finding] = field(default_factory=list)
    route: Route | None = None  # this box's interface towards the others
    master_port: int = 0
    notes: list[str] = field(default_factory=list)  # what each link means for tokens/s

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]


class HeadRanks:
    """The other ranks of one engine (runtime.supervisor.Ranks)."""

    def __init__(
        self,
        *,
        channel: Channel,
        profile: Profile,
        runtime: EngineRuntime,
        model: str,
        lease_s: float,
        poll_s: float,
    ) -> None:
        self._channel = channel
        self._profile = profile
        self._runtime = runtime
        self._model = model
        self._lease_s = lease_s
        self._poll_s = poll_s
        self._started: list[str] = []  # boxes running a rank of this life
        self._problem: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def engine_id(self) -> str:
        return self._profile.name

    async def begin(self, sink: LogSink) -> Profile:
        await self.end()
        sink(f"===== traylm: {ACROSS_BOXES_WARNING}")
        found = await preflight(self._channel, self._profile, self._runtime, self._model)
        for line in (*found.notes, *(f"preflight: {f.text}" for f in found.findings)):
            sink(f"===== traylm: {line}")
        if found.blocking:
            raise PreflightFailed("; ".join(f.text for f in found.blocking))
        assert found.route is not None
        nnodes = 1 + len(self._profile.boxes)
        body = {
            "engine_id": self.engine_id,
            "profile": follower_mapping(self._profile),
            "lease_s": self._lease_s,
        }
        self._problem = None
        try:
            for rank, box in enumerate(self._profile.boxes, start=1):
                plan = {
                    "nnodes": nnodes,
                    "node_rank": rank,
                    "master_port": found.master_port,
                    "master_addr": found.route.address,
                }
                answer = await self._call(box, "POST", "/peer/spread/ranks", {**body, "plan": plan})
                self._started.append(box)
                sink(f"===== traylm: rank {rank} started on {box} ({answer.get('interface')})")
        except TraylmError:
            await self.end()
            raise
        self._task = asyncio.create_task(self._heartbeat(), name=f"ranks:{self.engine_id}")
        head = RankPlan(
            nnodes=nnodes,
            node_rank=0,
            master_addr=found.route.address,
            master_port=found.master_port,
            interface=found.route.interface,
            host_ip=found.route.address,
            rdma=has_rdma(),
        )
        return rank_profile(self._profile, head)

    def problem(self) -> str | None:
        return self._problem

    async def end(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        started, self._started = self._started, []
        await asyncio.gather(*(self._stop(box) for box in started))

    async def _stop(self, box: str) -> None:
        path = f"/peer/spread/ranks/{self._rank_id}"
        try:
            await self._call(box, "DELETE", path)
        except TraylmError as exc:  # its lease ends it once it stops hearing from this box
            log.warning(
                "%s; %s ends the rank itself within %.0f s", exc.message, box, self._lease_s
            )

    @property
    def _rank_id(self) -> str:
        return f"{self._channel.box_name}.{self.engine_id}"

    async def _heartbeat(self) -> None:
        """Ask every box about its rank each poll (which renews its lease there)."""
        misses = dict.fromkeys(self._started, 0)
        while self._problem is None:
            await asyncio.sleep(self._poll_s)
            for box in list(misses):
                try:
                    state = await self._call(box, "GET", f"/peer/spread/ranks/{self._rank_id}")
                except TraylmError as exc:
                    misses[box] += 1
                    if misses[box] >= MISSES_BEFORE_SILENT:
                        self._problem = f"{box} stopped answering: {exc.message}"
                    continue
                misses[box] = 0
                if state.get("state") != "running":
                    error = state.get("last_error") or ""
                    self._problem = f"the rank on {box} ended: {state.get('why')}" + (
                        f" (last error: {str(error)[:200]})" if error else ""
                    )
            if self._problem:
                log.warning("engine %s: %s; ending every rank", self.engine_id, self._problem)

    async def _call(
        self, box: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return await self._channel.call(box, method, path, body)


def follower_mapping(profile: Profile) -> dict[str, Any]:
    """The profile as the other boxes get it: their own planner picks their GPUs."""
    return profile_to_mapping(dataclasses.replace(profile, gpus=()))


async def preflight(
    channel: Channel, profile: Profile, runtime: EngineRuntime, model: str
) -> Preflight:
    """Every box checked against this one; nothing is started."""
    found = Preflight()
    own = Facts(
        box=channel.box_name,
        engine_version=str(runtime.version),
        engine_problem="",
        model_digest=await local_digest(model, profile.revision),
        model_problem="",
        time_s=time.time(),
        interface="",
        address="",
    )
    routes: list[Route] = []
    for box in profile.boxes:
        try:
            address = channel.address(box)
            route = await asyncio.to_thread(route_to, host_of(address), box)
            routes.append(route)
            await _check_box(channel, profile, box, own, route, found)
        except TraylmError as exc:
            found.findings.append(Finding(box, "box", exc.message))
    if len({r.interface for r in routes}) > 1:
        found.findings.append(
            Finding(
                channel.box_name,
                "interface",
                f"{channel.box_name} reaches the other boxes on different interfaces "
                f"({', '.join(sorted({r.interface for r in routes}))}): put every box on one "
                "network and pair them on its addresses",
            )
        )
    if routes:
        found.route = routes[0]
    return found


async def _check_box(
    channel: Channel, profile: Profile, box: str, own: Facts, route: Route, found: Preflight
) -> None:
    body = {
        "engine_id": profile.name,
        "profile": follower_mapping(profile),
        "head_host": route.address,
    }
    sent = time.time()
    answer = await channel.call(box, "POST", "/peer/spread/facts", body)
    took_s = time.time() - sent  # the model's digest there included
    facts = _facts(box, answer)
    skew = facts.time_s - (sent + took_s)  # it answered at the end: late by at most a hop
    rtt_s = await channel.round_trip(box)
    found.findings.extend(compare(own, facts, skew_s=skew))
    if not found.master_port:
        found.master_port = free_port_on(route.address)
    reach = await _reach(channel, box, route.address, found.master_port)
    if reach:
        found.findings.append(
            port_closed(box, channel.box_name, route.address, found.master_port, reach)
        )
    found.notes.append(await _link(channel, box, profile, rtt_s))


async def _reach(channel: Channel, box: str, address: str, port: int) -> str:
    """Whether ``box`` can open the rendezvous port here: "" or its error. A listener holds
    the port for the check and closes before vLLM binds it."""
    server = await asyncio.start_server(_close, address, port)
    try:
        answer = await channel.call(
            box, "POST", "/peer/spread/reach", {"host": address, "port": port}
        )
    finally:
        server.close()
        await server.wait_closed()
    return "" if answer.get("reached") else str(answer.get("error") or "no answer")


async def _close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _link(channel: Channel, box: str, profile: Profile, rtt_s: float) -> str:
    """Measure the link to ``box`` over the paired channel (TLS: a floor of the wire's speed)
    and say what it means for this model's tokens/s."""
    blob = os.urandom(PROBE_BYTES)
    start = time.monotonic()
    try:
        await channel.upload(box, "/peer/spread/sink", blob)
    except PeerError as exc:
        return f"link to {box}: not measured ({exc.message})"
    seconds = max(time.monotonic() - start, 1e-6)
    info = await asyncio.to_thread(read_model_info, profile.model, profile.revision)
    hidden = int(info.config.get("hidden_size", 0)) if info else 0
    dtype = 4 if profile.dtype == "float32" else 2
    meaning = link_meaning(
        box=box,
        bandwidth_bytes_s=PROBE_BYTES / seconds,
        rtt_s=rtt_s,
        hidden_size=hidden,
        dtype_bytes=dtype,
    )
    return meaning.text


def _facts(box: str, answer: dict[str, Any]) -> Facts:
    try:
        return Facts(
            box=str(answer["box"]),
            engine_version=str(answer["engine_version"]),
            engine_problem=str(answer["engine_problem"]),
            model_digest=str(answer["model_digest"]),
            model_problem=str(answer["model_problem"]),
            time_s=float(answer["time_s"]),
            interface=str(answer["interface"]),
            address=str(answer["address"]),
        )
    except (KeyError, TypeError, ValueError):
        raise PeerError(
            f"box {box!r} answered the preflight in a form this box does not know: run the "
            "same traylm version on every box"
        ) from None
