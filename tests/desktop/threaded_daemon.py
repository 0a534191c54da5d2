"""A REAL traylm daemon (engines.daemon.Daemon) running on a worker thread with its own asyncio
loop, for the desktop tests and the screenshot script: the Qt event loop owns the main thread,
so the in-process daemon of tests/conftest.py could not run while a test waits on Qt signals."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from engines.client import DaemonClient
from engines.config.sections import EnergySettings, GPUSettings, Paths, Settings
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.daemon import Daemon
from engines.events import EngineState, EngineStatus
from tests.conftest import fast_settings

T = TypeVar("T")


class ThreadedDaemon:
    """engines.daemon.Daemon running on a worker thread with its own asyncio loop."""

    def __init__(self, paths: Paths, settings: Settings) -> None:
        self.paths = paths
        self.settings = settings
        self.daemon: Daemon | None = None
        self.client: DaemonClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.settings.gateway.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> ThreadedDaemon:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def main() -> None:
                self.daemon = Daemon(self.paths, self.settings)
                started = asyncio.Event()
                task = asyncio.create_task(
                    self.daemon.run(ready=started, install_signal_handlers=False)
                )
                waiter = asyncio.create_task(started.wait())
                done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    waiter.cancel()
                    task.result()
                self.client = await DaemonClient.connect(self.paths)
                ready.set()
                try:
                    await task
                finally:
                    await self.client.close()

            try:
                loop.run_until_complete(main())
            except BaseException as exc:  # reported to the test thread
                failure.append(exc)
                ready.set()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="test-daemon", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError("the daemon did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self, timeout_s: float = 30) -> None:
        if self._thread is None or self._loop is None or self.daemon is None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.daemon.request_stop, "test")
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the daemon thread did not stop"
        self._thread = None

    def run(self, make: Callable[[DaemonClient], Awaitable[T]], timeout_s: float = 30) -> T:
        """Run ``make(client)`` on the daemon's loop and return its result."""
        assert self._loop is not None and self.client is not None
        client = self.client

        async def call() -> T:
            return await make(client)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout_s)

    def write_profile(self, name: str, **fields: Any) -> None:
        write_toml_atomic(self.paths.profiles_dir / f"{name}.toml", fields)

    def write_fake_profile(
        self, name: str = "fake", args: str = "", device: str = "cpu", **fields: Any
    ) -> None:
        self.write_profile(
            name,
            model="org/" + name,
            served_name=name,
            device=device,
            env={"FAKE_ENGINE_ARGS": args},
            **fields,
        )

    def engine(self, engine_id: str) -> EngineStatus | None:
        engines = self.run(lambda c: c.engines())
        return next((e for e in engines if e.engine_id == engine_id), None)

    def engine_state(self, engine_id: str) -> EngineState | None:
        engine = self.engine(engine_id)
        return engine.state if engine else None

    def feature(self, name: str) -> Any:
        """The daemon's part called ``name`` (gpu, hub, trt, remote, usage, chats, bench)."""
        assert self.daemon is not None
        return next(f for f in self.daemon.features if f.name == name)

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the daemon's loop (the simulator and features live there)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)


def sim_settings(**gpu: Any) -> Settings:
    """Two SIMULATED RTX 4090s (`traylm serve --simulate-gpus 2`), sampled twice a second."""
    values = {"simulate_gpus": 2, "sample_interval_s": 0.5, "history_resolution_s": 1.0, **gpu}
    return dataclasses.replace(
        fast_settings(free_loopback_port()),
        gpu=GPUSettings(**values),
        energy=EnergySettings(window_s=5.0),
    )
