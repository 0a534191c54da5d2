"""The dashboard's pages, in menu order: a plain registry.

Adding a page is one entry here: a ``build`` function that returns a ``Page``. A page whose
daemon API does not exist yet gets ``build=None`` and ``waits_for``; the dashboard then shows it
as "not available in this daemon yet" with what it waits for (desktop/dashboard/unavailable.py).
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


def _tune(ctx: PageContext) -> Page:
    from desktop.dashboard.tune_page import TunePage

    return TunePage(ctx)


def _engines(ctx: PageContext) -> Page:
    from desktop.dashboard.engines_page import EnginesPage

    return EnginesPage(ctx)


def _requests(ctx: PageContext) -> Page:
    from desktop.dashboard.requests_page import RequestsPage

    return RequestsPage(ctx)


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
    ),
    PageSpec(
        "engines",
        "Engines",
        _engines,
        "Engine status, start/stop, profiles, logs with diagnoses, engine environments (install "
        "with progress), TensorRT-LLM builds and engine cache, the remote fallback.",
    ),
    PageSpec(
        "models",
        "Models",
        _models,
        "Hub search, model details, fit badges for 1×/2× GPU and each engine, the download "
        "queue with progress/pause/cancel, and the local library with delete/verify.",
    ),
    PageSpec(
        "fans",
        "Fans & power",
        _fans,
        "A fan-curve editor per GPU and fan, a power-limit slider within the card's limits, "
        "thermal guard thresholds, and the traylm-gpud helper's status.",
    ),
    PageSpec(
        "bench",
        "Benchmarks",
        _bench,
        "Benchmark runs: start one, follow it, compare two (tokens/s, TTFT/TPOT/ITL/E2EL, "
        "energy per token), HTML reports.",
    ),
    PageSpec(
        "tune",
        "Tune",
        _tune,
        "The tuner: measure candidate settings for a profile on this machine (a preset or your "
        "recorded traffic, a goal, a time budget), follow it, read the table with its noise "
        "bands, Pareto set and recommendation, apply it or undo it.",
    ),
    PageSpec(
        "requests",
        "Requests",
        _requests,
        "Every request through the gateway (the flight recorder): a live list with filters, "
        "the request and its reply, the prompt as the engine templated it, copy as curl, replay.",
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
