"""The dashboard's pages, in menu order: a plain registry.

A page with ``build=None`` waits for a daemon API that other features add; the dashboard shows
it as "not available in this daemon yet" with what it waits for. Adding the real page later is
one entry here: a ``build`` function that returns a ``Page``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from desktop.dashboard.page import Page, PageContext


def _gpus(ctx: PageContext) -> Page:
    from desktop.dashboard.gpus_page import GPUsPage

    return GPUsPage(ctx)


def _fans(ctx: PageContext) -> Page:
    from desktop.dashboard.fans_page import FansPage

    return FansPage(ctx)


def _models(ctx: PageContext) -> Page:
    from desktop.dashboard.models_page import ModelsPage

    return ModelsPage(ctx)


def _bench(ctx: PageContext) -> Page:
    from desktop.dashboard.bench_page import BenchPage

    return BenchPage(ctx)


def _engines(ctx: PageContext) -> Page:
    from desktop.dashboard.engines_page import EnginesPage

    return EnginesPage(ctx)


def _settings(ctx: PageContext) -> Page:
    from desktop.dashboard.settings_page import SettingsPage

    return SettingsPage(ctx)


@dataclass(frozen=True)
class PageSpec:
    key: str
    title: str
    build: Callable[[PageContext], Page] | None
    purpose: str
    waits_for: str = ""

    @property
    def available(self) -> bool:
        return self.build is not None


PAGES: tuple[PageSpec, ...] = (
    PageSpec(
        "gpus",
        "GPUs",
        _gpus,
        "A card per GPU with live charts (temperature, power against the limit, fan %, "
        "utilization, VRAM, clocks), clock-event reasons in words, PCIe link and energy per "
        "token; 'simulated' shown when the simulator is the source.",
        "GPU telemetry in the daemon (issue 3): GET /api/gpus and the gpu.* events.",
    ),
    PageSpec(
        "engines",
        "Engines",
        _engines,
        "Engine status, start/stop, profiles, logs with diagnoses, engine environments.",
    ),
    PageSpec(
        "models",
        "Models",
        _models,
        "Hub search, model details, fit badges for 1×/2× GPU and each engine, the download "
        "queue with progress/pause/cancel, and the local library with delete/verify.",
        "the model hub in the daemon (issue 4): /api/models and /api/downloads with progress "
        "events.",
    ),
    PageSpec(
        "fans",
        "Fans & power",
        _fans,
        "A fan-curve editor per GPU, a power-limit slider within the card's limits, thermal "
        "guard thresholds, and the traylm-gpud helper's status.",
        "fan curves, power limits and the thermal guard (issue 3): /api/gpus/{i}/fans, "
        "/api/gpus/{i}/power and traylm-gpud.",
    ),
    PageSpec(
        "bench",
        "Benchmarks",
        _bench,
        "Benchmark runs and comparisons (throughput, TTFT, energy per token).",
        "the benchmark feature: an API that lists `traylm bench` runs (bench_runs table).",
    ),
    PageSpec(
        "settings",
        "Settings",
        _settings,
        "Port, LAN sharing, API keys, autostart, Hugging Face token, energy, simulator.",
    ),
)


def page_spec(key: str) -> PageSpec | None:
    return next((p for p in PAGES if p.key == key), None)
