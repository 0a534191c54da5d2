"""Replicas across boxes, on the box that asks: what each paired box serves
now, as upstreams the model router balances with this box's own engines (ondemand ``Boxes``).

While a box is paired, each paired box is asked ``GET /peer/models`` (mutual TLS) every
``peers.replicas_poll_s``. A box that answers is there, with its ready models and its GPUs;
each model is one more replica of its names (upstream ``NAME@BOX``: the box's peer listener,
engines/peers/serving.py). A box that does not answer in time, or answers an error, is away:
its replicas are left out of new requests, its requests in flight are ended with why (their
streamed clients get the gateway's error event), and it is asked again at the next poll, so it
comes back by itself. With no box paired nothing polls: the loop waits for a pairing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from engines.config.live import SettingsView
from engines.errors import PeerError
from engines.events.codec import Event, from_plain, to_plain
from engines.events.models import LoadedModel, ModelStatus, ReplicaInfo, ServableModel
from engines.events.peers import BoxesChanged, BoxModel, BoxServes
from engines.gateway.upstream import Upstream
from engines.peers import link
from engines.peers.service import PeersFeature

log = logging.getLogger(__name__)

MODELS_PATH = "/peer/models"
EndRequests = Callable[[str, str], int]
"""(upstream name, why) → how many requests in flight to it were ended (EngineTraffic.end_all)."""


@dataclass
class _Box:
    """What this box knows of one paired box."""

    serves: BoxServes | None = None
    """Its last answer (kept while it is away: `traylm ps` and the errors name what it served)."""
    problem: str = ""
    """Why it is away, naming the box and the fix; "" while it answers."""
    upstreams: dict[str, Upstream] = field(default_factory=dict)
    """Its replicas by every name that routes to them there."""


class BoxReplicas:
    """The paired boxes' models as replicas. Constructed without I/O; ``start`` begins the
    poll (which waits while no box is paired)."""

    name = "box-replicas"

    def __init__(
        self,
        *,
        peers: PeersFeature,
        settings: SettingsView,
        end_requests: EndRequests,
        publish: Callable[[Event], None],
    ) -> None:
        """``publish``: BoxesChanged when what the boxes serve here changed (the desktop then
        reads the status once, instead of asking every poll)."""
        self._peers = peers
        self._settings = settings
        self._end_requests = end_requests
        self._publish = publish
        self._said: dict[str, object] = {}
        self._boxes: dict[str, _Box] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="box replicas")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()  # with no box paired: forgets the boxes, asks nobody
            except Exception:  # boundary: the poll goes on; the next one may succeed
                log.exception("asking the paired boxes what they serve failed")
            if self._peers.names():
                await asyncio.sleep(self._settings.current.peers.replicas_poll_s)
            else:
                await self._peers.until_paired()

    async def refresh(self) -> None:
        """Ask every paired box once what it serves (together, each bounded by
        peers.request_timeout_s)."""
        try:
            await self._ask_all()
        finally:
            if (now := self.status()) != self._said:
                self._said = now
                away = tuple(sorted(n for n, b in self._boxes.items() if b.problem))
                self._publish(BoxesChanged(boxes=tuple(sorted(now)), away=away))

    async def _ask_all(self) -> None:
        names = self._peers.names()
        for gone in self._boxes.keys() - set(names):  # unpaired since
            self._mark_away(gone, f"box {gone!r} is no longer paired")
            del self._boxes[gone]
        answers = await asyncio.gather(*(self._ask(n) for n in names), return_exceptions=True)
        paired = set(self._peers.names())
        for name, answer in zip(names, answers, strict=True):
            if name not in paired:  # unpaired while it was asked: gone at the next refresh
                continue
            if isinstance(answer, PeerError):
                self._mark_away(name, answer.message)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                self._there(name, answer)

    async def _ask(self, name: str) -> BoxServes:
        """The box's answer to /peer/models; PeerError naming the box and the fix."""
        peer = self._peers.peer(name)
        try:
            async with self._peers.session(name) as http, http.get(MODELS_PATH) as resp:
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise link.explain(peer, exc) from None
        except ValueError:
            raise PeerError(
                f"box {name!r} answered {MODELS_PATH} with something not JSON (HTTP "
                f"{resp.status}); is it the same traylm version?"
            ) from None
        if resp.status != 200:
            raise PeerError(f"box {name!r} refused to say what it serves: {_error_of(data)}")
        return parse_serves(name, data)

    def _there(self, name: str, serves: BoxServes) -> None:
        box = self._boxes.setdefault(name, _Box())
        if box.problem:
            log.info("box %s answers again: its models are replicas here again", name)
        box.serves, box.problem = serves, ""
        address, tls = self._peers.peer(name).address, self._peers.client_context(name)
        ups: dict[str, Upstream] = {}
        for model in serves.models:
            up = Upstream(
                f"{model.name}@{name}", str(link.base_url(address)), {}, box=name, tls=tls
            )
            for each in model.names:
                ups.setdefault(each, up)
        for gone in {u.name for u in box.upstreams.values()} - {u.name for u in ups.values()}:
            self._end_requests(gone, f"box {name!r} no longer serves {gone.rpartition('@')[0]}")
        box.upstreams = ups

    def _mark_away(self, name: str, problem: str) -> None:
        box = self._boxes.setdefault(name, _Box())
        if not box.problem:
            log.warning("box %s is away, its replicas left out: %s", name, problem)
        box.problem = problem
        for up_name in {u.name for u in box.upstreams.values()}:
            self._end_requests(up_name, problem)

    # ----------------------------------------------------------------- ondemand's Boxes

    def serving(self, model: str) -> list[Upstream]:
        return [
            up
            for box in self._boxes.values()
            if not box.problem and (up := box.upstreams.get(model)) is not None
        ]

    def away(self, model: str) -> str:
        return next(
            (b.problem for b in self._boxes.values() if b.problem and model in b.upstreams), ""
        )

    def rows(self) -> list[LoadedModel]:
        rows = []
        for name, box in self._boxes.items():
            if box.serves is None:
                continue
            gpus = {g.index: g.name for g in box.serves.gpus}
            for m in box.serves.models:
                on = ", ".join(f"GPU {i} {gpus.get(i, '?')}" for i in m.gpus) or "its CPU"
                rows.append(
                    LoadedModel(
                        name=m.name,
                        engine_id=f"{m.name}@{name}",
                        engine=m.engine,
                        state="away" if box.problem else "ready",
                        origin="box",
                        gpus=m.gpus,
                        vram_bytes=0,
                        in_flight=m.in_flight,
                        waiting=m.waiting,
                        idle_for_s=None,
                        unloads_in_s=None,
                        ttl_s=0.0,
                        pinned=False,
                        detail=box.problem or f"on {name}: {on}",
                        box=name,
                    )
                )
        return rows

    def listed(self, known: set[str]) -> list[ServableModel]:
        by_name: dict[str, list[tuple[str, BoxModel]]] = {}
        for name, box in self._boxes.items():
            if box.serves is not None and not box.problem:
                for m in box.serves.models:
                    if m.name not in known:
                        by_name.setdefault(m.name, []).append((name, m))
        return [_listed(name, found) for name, found in by_name.items()]

    def copies(self, names: Collection[str]) -> tuple[ReplicaInfo, ...]:
        """/v1/models: the boxes' copies of a model this box lists too (any of its ``names``),
        each as a replica (``NAME@BOX``) beside this box's own engines."""
        wanted = set(names)
        return tuple(
            ReplicaInfo(f"{m.name}@{name}", "ready", m.gpus, m.in_flight)
            for name, box in self._boxes.items()
            if box.serves is not None and not box.problem
            for m in box.serves.models
            if wanted & {m.name, *m.names}
        )

    def status(self) -> dict[str, object]:
        """/api/status ``boxes``: each paired box's models and GPUs (``BoxGPU``: index, name,
        memory) as last heard, or why not (``problem``)."""
        return {
            name: {
                "problem": box.problem,
                "models": [m.name for m in box.serves.models] if box.serves else [],
                "gpus": [to_plain(g) for g in box.serves.gpus] if box.serves else [],
            }
            for name, box in self._boxes.items()
        }


def _listed(name: str, found: list[tuple[str, BoxModel]]) -> ServableModel:
    """A model only paired boxes serve, as /v1/models lists it (its boxes as replicas)."""
    box, first = found[0]
    replicas = tuple(ReplicaInfo(f"{name}@{b}", "ready", m.gpus, m.in_flight) for b, m in found)
    return ServableModel(
        name=name,
        aliases=(),
        names=first.names,
        kind="box",
        engine_id=f"{name}@{box}",
        engine=first.engine,
        model="",
        status=ModelStatus.LOADED,
        state="ready",
        gpus=first.gpus,
        external=True,
        detail="on " + ", ".join(b for b, _ in found),
        replicas=replicas if len(replicas) > 1 else (),
    )


def parse_serves(box: str, data: Any) -> BoxServes:
    """A box's /peer/models answer, checked: PeerError (naming the box) when malformed."""
    try:
        serves = from_plain(BoxServes, data) if isinstance(data, Mapping) else None
        ok = serves is not None and all(
            isinstance(m.name, str)
            and m.name
            and all(isinstance(n, str) for n in m.names)
            and isinstance(m.engine, str)
            and all(isinstance(g, int) for g in m.gpus)
            and isinstance(m.in_flight, int)
            and isinstance(m.waiting, int)
            for m in serves.models
        )
        ok = ok and serves is not None and all(isinstance(g.index, int) for g in serves.gpus)
    except (TypeError, AttributeError, ValueError):
        ok = False
    if not ok or serves is None:
        raise PeerError(
            f"box {box!r} gave a malformed list of the models it serves; is it the same traylm "
            "version as this box?"
        )
    return serves


def _error_of(data: Any) -> str:
    error = data.get("error") if isinstance(data, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    return str(message or "no reason given")
