"""Each engine's own metrics: the token counters by the names its source registers, read from
its Prometheus route. TensorRT-LLM serves Prometheus text on /prometheus/metrics; its /metrics
is a JSON route that drains the iteration stats, so liveness and energy never poll it (a real
aiohttp server stands in for trtllm-serve's two routes: TensorRT-LLM cannot run here)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp import web

from engines.config.profiles import profile_from_mapping
from engines.config.sections import EngineSettings
from engines.core.procs import PidRegistry
from engines.gpu.energy import parse_generation_tokens
from engines.gpu.service import _scrape_tokens
from engines.runtime.adapters import adapter_for
from engines.runtime.liveness import progress_counter
from engines.runtime.probe import token_counters
from engines.runtime.supervisor import ManagedEngine
from tests.engines.runtime.adapters import test_sglang, test_trtllm

# the Prometheus text each engine serves, with the names its source registers
VLLM = """\
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 40.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 5.0
"""
SGLANG = """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 12.0
sglang:generation_tokens_total{model_name="m"} 30.0
"""
TRTLLM = """\
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{engine_type="trtllm",model_name="m"} 25.0
trtllm_prompt_tokens_total{engine_type="trtllm",model_name="m"} 7.0
trtllm_request_success_total{engine_type="trtllm",finished_reason="stop",model_name="m"} 2.0
"""


def test_each_engine_reads_its_own_token_counters() -> None:
    assert progress_counter(VLLM, "vllm") == 55.0
    assert progress_counter(SGLANG, "sglang") == 42.0
    assert progress_counter(TRTLLM, "trtllm") == 32.0
    assert progress_counter(VLLM, "sglang") is None  # another engine's names are not its own
    assert parse_generation_tokens(VLLM, "vllm") == 40.0
    assert parse_generation_tokens(SGLANG, "sglang") == 30.0
    assert parse_generation_tokens(TRTLLM, "trtllm") == 25.0
    assert parse_generation_tokens(TRTLLM, "vllm") is None
    assert parse_generation_tokens(VLLM, "llama.cpp") is None  # an engine traylm cannot read


def _engine(tmp_path: Path, engine: str, port: int) -> ManagedEngine:
    runtimes = {"trtllm": test_trtllm.runtime(), "sglang": test_sglang.runtime()}
    fields = {"model": "/m", "engine": engine, "device": "cuda"}
    p = profile_from_mapping("p", fields)
    adapter = adapter_for(engine)
    managed = ManagedEngine(
        "p",
        profile=p,
        adapter=adapter,
        runtime=runtimes[engine],
        model="/m",
        settings=EngineSettings(),
        log_path=tmp_path / "p.log",
        pids=PidRegistry(tmp_path / "pids.json"),
        publish=lambda event: None,
    )
    # what a start sets: the launch spec and the port (the process itself cannot run here)
    managed._spec = adapter.launch(p, runtime=runtimes[engine], port=port, model="/m")
    managed.port = port
    return managed


async def test_trtllm_is_read_on_its_prometheus_route_and_json_metrics_never(
    tmp_path: Path,
) -> None:
    drained: list[str] = []

    async def json_metrics(request: web.Request) -> web.Response:
        drained.append(request.path)  # FAKE trtllm-serve /metrics: a read drains the stats
        return web.json_response([{"iter": 1}])

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(text=TRTLLM, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", json_metrics)
    app.router.add_get("/prometheus/metrics", prometheus)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        engine = _engine(tmp_path, "trtllm", port)
        assert engine.metrics_url == f"http://127.0.0.1:{port}/prometheus/metrics"
        async with aiohttp.ClientSession() as http:
            assert await token_counters(http, engine.metrics_url, "trtllm") == 32.0
            assert await _scrape_tokens(http, engine.metrics_url, "trtllm") == 25.0
        assert drained == []
    finally:
        await runner.cleanup()


def test_engines_without_a_prometheus_route_are_not_polled(tmp_path: Path) -> None:
    engine = _engine(tmp_path, "sglang", 1234)
    assert engine.metrics_url == "http://127.0.0.1:1234/metrics"
    built = _engine(tmp_path, "trtllm", 1234)
    built._spec = built._spec.__class__(argv=(), env={}, served_names=(), metrics_path=None)
    assert built.metrics_url is None
