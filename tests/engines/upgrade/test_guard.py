"""The guarded upgrade's verdict (engines/upgrade/guard.py) on real tuner decisions
(engines/tune/verdict.py decide): a pinned figure worse by more than 5 % and its noise band
refuses the new version and is named; one inside either is not; failed requests refuse."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engines.events.tune import TuneConfig, TuneJob, TuneMeasure, TuneState
from engines.tune.candidates import DEFAULT, Candidate
from engines.tune.verdict import decide
from engines.upgrade.guard import LIMIT, judge

NEW = Candidate("version-0.33.0", "vLLM 0.33.0", fields={"engine_version": "0.33.0"})
OLD = {"ttft_p95_ms": 100.0, "output_tps": 1000.0, "tpot_p50_ms": 10.0, "failed": 0.0}


def tune_of(old: Sequence[Mapping[str, float]], new: Sequence[Mapping[str, float]]) -> TuneJob:
    """A finished tune of two rows, decided as the tuner decides."""
    measures = [TuneMeasure(candidate=c.key, round=i, figures=f)
                for c, runs in ((DEFAULT, old), (NEW, new)) for i, f in enumerate(runs)]  # fmt: skip
    d = decide([DEFAULT, NEW], measures, goal="throughput", concurrency=8, price_per_kwh=0.3,
               currency="EUR")  # fmt: skip
    return TuneJob(id=1, config=TuneConfig(model="chat"), state=TuneState.DONE, rows=d.rows)


def times(base: Mapping[str, float], **factors: float) -> dict[str, float]:
    return {k: v * factors.get(k, 1.0) for k, v in base.items()}


def test_a_figure_worse_past_the_limit_refuses_and_is_named() -> None:
    slower = times(OLD, ttft_p95_ms=1.2)
    v = judge(tune_of([OLD, OLD], [slower, slower]), NEW.key)
    assert not v.switch and v.measured
    assert v.worse == ("TTFT p95 ms worse by 20% (100.0 → 120.0; limit 5%)",)
    assert abs(v.changes["ttft_p95_ms"] - 1.2) < 1e-9


def test_lower_throughput_counts_as_worse_and_better_figures_do_not() -> None:
    v = judge(tune_of([OLD, OLD], [times(OLD, output_tps=0.9, ttft_p95_ms=0.5)] * 2), NEW.key)
    assert not v.switch and [w.split(" worse")[0] for w in v.worse] == ["out tok/s"]


def test_worse_inside_the_limit_or_the_noise_band_switches() -> None:
    a_little = times(OLD, ttft_p95_ms=1 + LIMIT * 0.8)
    assert judge(tune_of([OLD, OLD], [a_little, a_little]), NEW.key).switch
    # the old version's two runs differ by ±20 %: a 15 % worse TTFT is inside that band
    noisy = [times(OLD, ttft_p95_ms=0.8), times(OLD, ttft_p95_ms=1.2)]
    v = judge(tune_of(noisy, [times(OLD, ttft_p95_ms=1.15)] * 2), NEW.key)
    assert v.switch, v.worse
    assert "no pinned figure worse by more than 5%" in v.words


def test_failed_requests_refuse() -> None:
    v = judge(tune_of([OLD, OLD], [times(OLD), {**OLD, "failed": 2.0}]), NEW.key)
    assert not v.switch and v.worse == ("failed requests 0 → 1",)


def test_a_new_version_that_did_not_run_or_a_failed_comparison_does_not_switch() -> None:
    broken = [TuneMeasure(candidate="default", round=0, figures=OLD),
              TuneMeasure(candidate="default", round=1, figures=OLD),
              TuneMeasure(candidate=NEW.key, round=0, error="did not start: exit code 2")]  # fmt: skip
    rows = decide([DEFAULT, NEW], broken, goal="throughput", concurrency=8, price_per_kwh=0,
                  currency="EUR").rows  # fmt: skip
    job = TuneJob(id=1, config=TuneConfig(model="chat"), state=TuneState.DONE, rows=rows)
    v = judge(job, NEW.key)
    assert not v.switch and v.measured and "did not start: exit code 2" in v.words
    failed = TuneJob(id=2, config=TuneConfig(model="chat"), state=TuneState.FAILED,
                     detail="your profile chat itself failed: ...")  # fmt: skip
    v = judge(failed, NEW.key)
    assert not v.switch and not v.measured and "itself failed" in v.words
