"""Helpers for the models-on-demand tests: real daemons with the FAKE vLLM env (tests/fakes),
profiles written as TOML, and event collection from the daemon's bus."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from engines.config.sections import GPUSettings, Paths, Settings
from engines.core.procs import free_loopback_port
from engines.events.codec import Event
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.engines.hub.conftest import fake_hub, hf_home  # noqa: F401  (fixtures)
from tests.fakes.fake_vllm_env import make_fake_vllm_env


def settings(
    *, gpus: int = 0, reserved: tuple[int, ...] = (), jit: bool = True, **engines: Any
) -> Settings:
    base = fast_settings(free_loopback_port())
    return dataclasses.replace(
        base,
        engines=dataclasses.replace(base.engines, jit=jit, **engines),
        gpu=GPUSettings(simulate_gpus=gpus, reserved=reserved, process_interval_s=1),
    )


def fake_profile(d: RunningDaemon, name: str, *, args: str = "", **fields: Any) -> None:
    """A profile run by the FAKE engine (``args``: its options, see openai_engine.py): on the
    (simulated) GPUs when the daemon has them, else on the CPU; ``device`` says otherwise."""
    fields.setdefault("device", "cuda" if d.daemon.ondemand.placer.infos else "cpu")
    d.write_profile(
        name,
        model="org/" + name,
        served_name=name,
        env={"FAKE_ENGINE_ARGS": args},
        **fields,
    )


def sdk(d: RunningDaemon, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, **kw)


async def ask(client: openai.AsyncOpenAI, model: str, **kw: Any) -> str:
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **kw
    )
    return reply.choices[0].message.content or ""


class Events:
    """Every event of the given kinds the daemon publishes from now on."""

    def __init__(self, d: RunningDaemon, *kinds: str) -> None:
        self._cm = d.daemon.bus.subscribe(frozenset(kinds))
        self._sub = self._cm.__enter__()
        self.seen: list[Event] = []

    async def wait(self, match: Callable[[Any], bool], timeout_s: float = 30) -> Any:
        """The first event (seen before or arriving) that ``match`` accepts."""
        for event in self.seen:
            if match(event):
                return event

        async def next_match() -> Any:
            while True:
                event = await self._sub.get()
                self.seen.append(event)
                if match(event):
                    return event

        return await asyncio.wait_for(next_match(), timeout_s)

    def drain(self) -> list[Event]:
        """Every event so far (those still queued included)."""
        while not self._sub.queue.empty():
            self.seen.append(self._sub.queue.get_nowait())
        return list(self.seen)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


@pytest.fixture
def fake_env(paths: Paths) -> Path:
    """The FAKE vLLM env for the CPU and one for CUDA (the simulated GPUs' engines)."""
    make_fake_vllm_env(paths.envs_dir, device="cuda")
    return make_fake_vllm_env(paths.envs_dir)


@pytest.fixture
async def od(daemon_factory: DaemonFactory, fake_env: Any) -> RunningDaemon:
    """A daemon with the FAKE vLLM env and no GPUs."""
    result: RunningDaemon = await daemon_factory(settings())
    return result


@pytest.fixture
def events_of() -> Any:
    made: list[Events] = []

    def make(d: RunningDaemon, *kinds: str) -> Events:
        e = Events(d, *kinds)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


__all__ = ["Events", "ask", "fake_profile", "sdk", "settings"]
