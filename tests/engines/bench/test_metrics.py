"""Benchmark maths against hand-computed values: percentiles (numpy's linear method), the vLLM
definitions of TTFT/TPOT/ITL/E2EL and throughputs, energy per token from counter samples, the
workloads that need no engine, comparisons and the HTML report."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from engines.bench.compare import compare, format_table
from engines.bench.load import Target, poisson_arrivals_s, request_body
from engines.bench.metrics import RequestTiming, latency_stats, level_result, percentile
from engines.bench.prompts import build_requests
from engines.bench.report import render_report
from engines.bench.service import config_from_body
from engines.bench.telemetry import Sample, TelemetryRecorder, energy_at_mj
from engines.errors import ConfigError
from engines.events import (
    BenchConfig,
    BenchRun,
    BenchState,
    BenchTelemetry,
    FanReading,
    GPUInfo,
    GPUSnapshot,
    from_plain,
    to_plain,
)

NO_TELEMETRY = BenchTelemetry(available=False, detail="none")


def approx(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-12)


# --------------------------------------------------------------------------- percentiles


def test_percentile_is_numpy_linear() -> None:
    # numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = 1, 2.5, 3.7, 3.97, 4
    xs = [4.0, 1.0, 3.0, 2.0]
    assert [percentile(xs, p) for p in (0, 50, 90, 99, 100)] == pytest.approx(
        [1.0, 2.5, 3.7, 3.97, 4.0]
    )
    # rank (5 - 1) × 0.4 = 1.6 → 20 + 0.6 × (35 - 20) = 29
    assert percentile([15, 20, 35, 40, 50], 40) == pytest.approx(29.0)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_stats_mean_std_and_keys() -> None:
    stats = latency_stats([1.0, 2.0, 3.0, 4.0], (50, 99.9))
    assert stats.count == 4 and stats.mean_s == 2.5
    assert stats.std_s == pytest.approx(math.sqrt(1.25))  # population std, numpy's default
    assert stats.min_s == 1.0 and stats.max_s == 4.0
    assert stats.percentiles_s == {"50": 2.5, "99.9": pytest.approx(3.997)}
    assert latency_stats([]).count == 0 and latency_stats([]).mean_s is None


# --------------------------------------------------------------------------- per request


def test_request_definitions_match_vllm() -> None:
    t = RequestTiming(
        start_s=10.0, end_s=11.7, chunk_times_s=(10.5, 10.7, 11.0, 11.6), usage_output_tokens=4
    )
    assert approx(t.ttft_s, 0.5) and approx(t.e2el_s, 1.6)
    assert approx(t.tpot_s, 1.1 / 3)  # (E2EL − TTFT) / (4 − 1)
    assert t.itl_s == pytest.approx([0.2, 0.3, 0.6])
    # the engine merged tokens into fewer chunks: TPOT uses the token count, ITL the chunks
    merged = RequestTiming(
        start_s=10.0, end_s=11.7, chunk_times_s=(10.5, 11.6), usage_output_tokens=7
    )
    assert approx(merged.tpot_s, 1.1 / 6) and merged.itl_s == pytest.approx([1.1])
    # no usage: output tokens are the chunks counted
    plain = RequestTiming(start_s=0.0, end_s=1.0, chunk_times_s=(0.2, 0.4, 0.5))
    assert plain.output_tokens == 3 and approx(plain.tpot_s, 0.15)
    one = RequestTiming(start_s=0.0, end_s=1.0, chunk_times_s=(0.2,), usage_output_tokens=1)
    assert one.tpot_s is None and one.itl_s == []  # TPOT only when output tokens > 1
    failed = RequestTiming(start_s=0.0, end_s=0.1, error="HTTP 500: boom")
    assert not failed.ok and failed.ttft_s is None


def test_level_result_by_hand() -> None:
    a = RequestTiming(
        start_s=100.0,
        end_s=101.7,
        chunk_times_s=(100.5, 100.7, 101.0, 101.6),
        usage_output_tokens=4,
        usage_input_tokens=10,
        input_tokens=12,
        input_source="tokenize",
    )
    b = RequestTiming(
        start_s=100.2,
        end_s=101.0,
        chunk_times_s=(100.5, 100.9),
        input_tokens=20,
        input_source="tokenize",
    )
    c = RequestTiming(start_s=100.3, end_s=100.4, error="HTTP 500: boom")
    level = level_result(
        [a, b, c],
        concurrency=2,
        rate_rps=0.0,
        requests=3,
        level_start_s=100.0,
        duration_s=2.0,
        max_concurrency_seen=2,
        telemetry=NO_TELEMETRY,
    )
    assert (level.completed, level.failed) == (2, 1)
    assert level.output_tokens == 6 and level.input_tokens == 30  # usage 10 + tokenize 20
    assert level.input_tokens_source == "mixed" and level.output_tokens_source == "mixed"
    assert level.request_throughput_rps == 1.0
    assert level.output_throughput_tps == 3.0
    assert level.total_throughput_tps == 18.0  # (30 + 6) / 2
    assert level.ttft.mean_s == pytest.approx(0.4)  # (0.5 + 0.3) / 2
    assert level.e2el.percentiles_s["50"] == pytest.approx((1.6 + 0.7) / 2)
    assert level.tpot.percentiles_s["50"] == pytest.approx(((1.1 / 3) + 0.4) / 2)
    # ITL pooled: [0.2, 0.3, 0.6] + [0.4] → median of 0.2, 0.3, 0.4, 0.6 = 0.35
    assert level.itl.count == 4 and level.itl.percentiles_s["50"] == pytest.approx(0.35)
    assert level.errors == {"HTTP 500: boom": 1}
    rows = level.requests_detail
    assert [r.start_s for r in rows] == pytest.approx([0.0, 0.2, 0.3])
    assert rows[2].error == "HTTP 500: boom" and rows[2].output_tokens == 0
    # it survives the wire (what the worker sends and SQLite stores)
    assert from_plain(type(level), to_plain(level)) == level


# --------------------------------------------------------------------------- energy


def snap(uuid: str, ts: float, energy_mj: int, power_mw: int, **kw: object) -> GPUSnapshot:
    return GPUSnapshot(
        uuid=uuid, index=0, ts_s=ts, energy_mj=energy_mj, power_draw_mw=power_mw, **kw
    )  # type: ignore[arg-type]


def test_energy_counter_interpolated_and_carried() -> None:
    series = [snap("a", 100.0, 1_000, 50_000), snap("a", 101.0, 51_000, 50_000)]
    assert energy_at_mj(series, 100.5, 2.0) == pytest.approx(26_000)
    assert energy_at_mj(series, 101.5, 2.0) == pytest.approx(76_000)  # + 50 W × 0.5 s
    assert energy_at_mj(series, 99.0, 2.0) == pytest.approx(-49_000)  # carried back 1 s
    assert energy_at_mj(series, 104.0, 2.0) is None  # too far from any sample


def test_window_sums_gpus_and_divides_by_tokens() -> None:
    rec = TelemetryRecorder(None)
    rec.problem = ""
    rec.infos = (GPUInfo(uuid="a", index=0, name="A"), GPUInfo(uuid="b", index=1, name="B"))
    rec.simulated, rec.backend = True, "simulated"
    for i in range(5):  # GPU a draws 100 W, GPU b 50 W, one sample a second
        t = 1000.0 + i
        rec.samples.append(
            Sample(
                t,
                (
                    snap(
                        "a",
                        t,
                        100_000 * i,
                        100_000,
                        temperature_c=60 + i,
                        memory_used_bytes=2,
                        fans=(FanReading(index=0, speed_pct=30 + 10 * i),),
                    ),
                    snap(
                        "b",
                        t,
                        50_000 * i,
                        50_000,
                        temperature_c=50,
                        memory_used_bytes=3,
                        fans=(FanReading(index=0, speed_pct=45), FanReading(index=1)),
                    ),
                ),
            )
        )
    w = rec.window(1000.5, 1003.5, output_tokens=90)
    assert w.available and w.simulated and "SIMULATED" in w.detail
    assert w.energy_source == "counter"
    assert w.energy_j == pytest.approx(450.0)  # 3 s × 150 W
    assert w.joules_per_token == pytest.approx(5.0)
    assert w.power_mean_w == pytest.approx(150.0)
    assert w.samples == 3 and w.temperature_peak_c == 63 and w.temperature_mean_c == 62
    assert w.memory_used_peak_bytes == 5
    assert w.fan_speed_peak_pct == 60  # the fastest fan inside the window (70 % comes after it)
    assert [g.energy_j for g in w.gpus] == pytest.approx([300.0, 150.0])
    assert w.power_w == pytest.approx((150.0, 150.0, 150.0))


def test_no_telemetry_says_why() -> None:
    w = TelemetryRecorder(None).window(0, 1, 10)
    assert not w.available and "no connection" in w.detail


# --------------------------------------------------------------------------- workloads


async def test_random_workload_without_tokenizer_is_labelled_approx() -> None:
    specs = await build_requests(
        "random", count=5, input_len=40, output_len=16, seed=1, tokenizer=None
    )
    assert len(specs) == 5 and all(s.ignore_eos and s.max_tokens == 16 for s in specs)
    assert all(s.input_source == "approx" and s.input_tokens == 40 for s in specs)
    assert all(len(s.messages[0]["content"].split()) == 40 for s in specs)
    assert len({s.messages[0]["content"] for s in specs}) == 5  # every prompt differs
    again = await build_requests(
        "random", count=5, input_len=40, output_len=16, seed=1, tokenizer=None
    )
    assert again == specs  # the seed fixes the prompts
    body = request_body(Target("http://x/v1", "m"), specs[0])
    assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}


async def test_chat_workload_varies_and_lets_the_model_stop() -> None:
    specs = await build_requests(
        "chat", count=12, input_len=1, output_len=64, seed=0, tokenizer=None
    )
    assert not any(s.ignore_eos for s in specs) and all(s.max_tokens == 64 for s in specs)
    assert len({s.messages[0]["content"].split(".", 1)[1] for s in specs}) > 3
    assert "ignore_eos" not in request_body(Target("http://x/v1", "m"), specs[0])
    with pytest.raises(ConfigError, match="unknown workload"):
        await build_requests("sonnet", count=1, input_len=1, output_len=1, seed=0, tokenizer=None)


def test_poisson_arrivals() -> None:
    assert poisson_arrivals_s(3, 0.0, 0) == [0.0, 0.0, 0.0]
    times = poisson_arrivals_s(4000, 20.0, 7)
    assert times == poisson_arrivals_s(4000, 20.0, 7) and times[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0 and sum(gaps) / len(gaps) == pytest.approx(1 / 20, rel=0.06)


def test_config_from_body_checks_fields() -> None:
    config, key = config_from_body(
        {"model": "m", "concurrency": [1, 8], "rate_rps": 2, "api_key": "k"}
    )
    assert config == BenchConfig(model="m", concurrency=(1, 8), rate_rps=2.0) and key == "k"
    with pytest.raises(ConfigError, match="unknown fields colour"):
        config_from_body({"model": "m", "colour": 1})
    with pytest.raises(ConfigError, match="concurrency must be a list of whole numbers"):
        config_from_body({"model": "m", "concurrency": "8"})
    with pytest.raises(ConfigError, match="input_len must be int"):
        config_from_body({"model": "m", "input_len": 1.5})


# --------------------------------------------------------------------------- compare, report


def _run(run_id: int, tps_per_request: float, concurrency: tuple[int, ...]) -> BenchRun:
    levels = []
    for c in concurrency:
        timings = [
            RequestTiming(
                start_s=0.0,
                end_s=1.0,
                chunk_times_s=(0.1, 0.1 + 1 / tps_per_request),
                usage_output_tokens=2,
                usage_input_tokens=5,
            )
            for _ in range(c)
        ]
        levels.append(
            level_result(
                timings,
                concurrency=c,
                rate_rps=0.0,
                requests=c,
                level_start_s=0.0,
                duration_s=1.0,
                max_concurrency_seen=c,
                telemetry=NO_TELEMETRY,
            )
        )
    return BenchRun(
        id=run_id,
        name=f"run{run_id}",
        created_s=1.7e9,
        state=BenchState.DONE,
        config=BenchConfig(model="m", concurrency=concurrency),
        target="http://127.0.0.1:1/v1",
        levels=tuple(levels),
    )


def test_compare_ratios_and_table() -> None:
    a, b = _run(1, 10.0, (1, 2)), _run(2, 10.0, (2, 4))
    comp = compare([a, b])
    assert {r.concurrency for r in comp.rows} == {2}
    assert any("left out: 1, 4" in n for n in comp.notes)
    rows = {r.metric.label: r for r in comp.rows}
    assert rows["output tok/s"].values == (4.0, 4.0) and rows["output tok/s"].ratios == (1.0, 1.0)
    faster = _run(3, 20.0, (2,))  # TPOT halves
    rows = {r.metric.label: r for r in compare([a, faster]).rows}
    assert rows["TPOT p50 ms"].values == pytest.approx((100.0, 50.0))
    assert rows["TPOT p50 ms"].ratios[1] == pytest.approx(0.5)
    text = format_table(compare([a, faster]))
    assert "concurrency 2" in text and "0.50x+" in text  # lower TPOT is better


def test_compare_has_the_peak_fan_speed() -> None:
    """The figure `bench run --profiles` reports beside the temperature is compared too."""
    runs = []
    for run_id, fan in ((1, 40.0), (2, 60.0)):
        run = _run(run_id, 10.0, (2,))
        seen = BenchTelemetry(available=True, fan_speed_peak_pct=fan)
        levels = tuple(dataclasses.replace(lv, telemetry=seen) for lv in run.levels)
        runs.append(dataclasses.replace(run, levels=levels))
    rows = {r.metric.label: r for r in compare(runs).rows}
    assert rows["peak fan %"].values == (40.0, 60.0)
    assert rows["peak fan %"].ratios == pytest.approx((1.0, 1.5))
    assert "peak fan %" in format_table(compare(runs))


def test_report_is_self_contained() -> None:
    a, b = _run(1, 10.0, (1, 2)), _run(2, 20.0, (1, 2))
    html = render_report([a])
    assert html.startswith("<!doctype html>") and "<svg" in html
    assert "Throughput by concurrency" in html and "AIPerf" in html
    lowered = html.lower()
    assert "<script" not in lowered and "src=" not in lowered and "href=" not in lowered
    assert "url(" not in lowered and "@import" not in lowered
    both = render_report([a, b])
    assert "Comparison" in both and "(0.50×)" in both
