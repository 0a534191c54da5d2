"""From measurements to a decision: each candidate's means and noise band over its repeats, its
ratios to the default, the verdict on the goal's figure, the Pareto set, the recommendation in
words, and the electricity cost per 100 M tokens.

The noise band of a figure is engines.bench.noise's: half the spread of its repeats relative to
their mean (two runs at 100 and 110 tokens/s: ±4.8 %), at least ``MIN_BAND``; a candidate is
better or worse than the default only when their difference is larger than the wider of the two
bands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engines.bench import noise
from engines.bench.noise import MIN_BAND
from engines.events.tune import TuneMeasure, TuneRow
from engines.tune.candidates import POWER_APPLIES, Candidate
from engines.tune.figures import BY_KEY

JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Goal:
    figure: str  # the figure that decides
    fallback: str  # when that figure was not measured here (no GPU telemetry)
    words: str


GOALS: Mapping[str, Goal] = {
    "throughput": Goal("output_tps", "output_tps", "output tokens/s"),
    "latency": Goal("ttft_p95_ms", "ttft_p95_ms", "TTFT p95"),
    "efficiency": Goal("joules_per_token", "output_tps", "joules per token"),
    "quiet": Goal("power_mean_w", "output_tps", "mean power"),
}


@dataclass(frozen=True)
class Decision:
    rows: tuple[TuneRow, ...]
    recommended: str  # a row key, or "" (keep the default)
    recommendation: str
    figure: str  # the figure the goal was decided on


def decide(
    candidates: Sequence[Candidate],
    measures: Sequence[TuneMeasure],
    *,
    goal: str,
    concurrency: int,
    price_per_kwh: float,
    currency: str,
) -> Decision:
    """Rows for the measured candidates (the default first), and the decision."""
    rows = [
        _row(c, [m for m in measures if m.candidate == c.key], price_per_kwh) for c in candidates
    ]
    rows = [r for r in rows if r.runs or r.error]
    base = next((r for r in rows if r.key == "default" and not r.error), None)
    g = GOALS[goal]
    figure = g.figure if base is not None and g.figure in base.figures else g.fallback
    if base is None:
        return Decision(tuple(rows), "", "the default was not measured: nothing to compare", figure)
    rows = [_compared(r, base, figure) for r in rows]
    rows = _pareto(rows)
    winner = _winner(rows, figure)
    text = _words(winner, base, figure, concurrency, g, currency) if winner else _keep(base, figure)
    if winner is not None and any(c.key == winner.key and c.power_pct for c in candidates):
        text += POWER_APPLIES
    return Decision(tuple(rows), winner.key if winner else "", text, figure)


def _row(c: Candidate, measures: Sequence[TuneMeasure], price: float) -> TuneRow:
    good = [m for m in measures if not m.error]
    error = next((m.error for m in measures if m.error), "")
    figures: dict[str, float] = {}
    bands: dict[str, float] = {}
    spreads: dict[str, float] = {}
    for key in {k for m in good for k in m.figures}:
        values = [m.figures[key] for m in good if key in m.figures]
        figures[key] = noise.mean(values)
        bands[key] = noise.band(values)
        if len(values) > 1:
            spreads[key] = noise.spread(values)
    jpt = figures.get("joules_per_token")
    cost = jpt * 1e8 / JOULES_PER_KWH * price if jpt is not None else None
    return TuneRow(
        key=c.key,
        label=c.label,
        changes=c.changes,
        runs=len(good),
        figures=figures,
        band=bands,
        spread=spreads,
        verdict="failed" if error and not good else ("default" if c.key == "default" else ""),
        cost_per_100m=cost,
        error=error,
    )


def _compared(row: TuneRow, base: TuneRow, figure: str) -> TuneRow:
    if row.key == base.key or not row.runs:
        return row
    ratios = {k: v / base.figures[k] for k, v in row.figures.items() if base.figures.get(k)}
    verdict = "within noise"
    if row.runs < 2 or base.runs < 2:  # no spread, no band: never called better
        verdict = "one run"
    elif figure in ratios:
        band = band_of(row, base, figure)
        change = ratios[figure] - 1
        if abs(change) > band:
            good = (change > 0) == (BY_KEY[figure].better == "higher")
            verdict = "better" if good else "worse"
    if row.figures.get("failed", 0) > base.figures.get("failed", 0):
        verdict = "worse" if verdict != "better" else "mixed"
    return dataclasses.replace(row, ratios=ratios, verdict=verdict)


def _pareto(rows: list[TuneRow]) -> list[TuneRow]:
    """Not beaten on every one of tokens/s, TTFT p95 and J/token (those measured) at once."""
    keys = [
        k
        for k in ("output_tps", "ttft_p95_ms", "joules_per_token")
        if all(k in r.figures for r in rows if r.runs)
    ]
    measured = [r for r in rows if r.runs]

    def beats(a: TuneRow, b: TuneRow) -> bool:
        signs = [1 if BY_KEY[k].better == "higher" else -1 for k in keys]
        pairs = [(s * a.figures[k], s * b.figures[k]) for s, k in zip(signs, keys, strict=True)]
        return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)

    front = {r.key for r in measured if not any(beats(o, r) for o in measured if o is not r)}
    return [dataclasses.replace(r, pareto=r.key in front) for r in rows]


def _winner(rows: Sequence[TuneRow], figure: str) -> TuneRow | None:
    better = [r for r in rows if r.verdict == "better" and figure in r.figures]
    if not better:
        return None
    sign = 1 if BY_KEY[figure].better == "higher" else -1
    return max(better, key=lambda r: sign * r.figures[figure])


def _words(
    row: TuneRow, base: TuneRow, figure: str, concurrency: int, goal: Goal, currency: str
) -> str:
    ratio = row.ratios[figure]
    band = band_of(row, base, figure)
    head = (
        f"{row.label}: {ratio:.2f}x the tokens/s of your profile"
        if figure == "output_tps"
        else f"{row.label}: {goal.words} {pct(ratio)} against your profile"
    )
    parts = [f"{head} at concurrency {concurrency}"]
    if figure != "ttft_p95_ms" and "ttft_p95_ms" in row.ratios:
        parts.append(f"TTFT p95 {pct(row.ratios['ttft_p95_ms'])}")
    if figure != "output_tps" and "output_tps" in row.ratios:
        parts.append(f"tokens/s {pct(row.ratios['output_tps'])}")
    if row.cost_per_100m is not None:
        parts.append(f"{row.cost_per_100m:.2f} {currency} per 100 M tokens")
    return ", ".join(parts) + f" (noise band ±{band * 100:.0f} %)"


def _keep(base: TuneRow, figure: str) -> str:
    band = base.band.get(figure, MIN_BAND)
    return (
        f"keep your profile: no candidate beat it on {BY_KEY[figure].label} by more than the "
        f"noise band (±{band * 100:.0f} %)"
    )


def band_of(row: TuneRow, base: TuneRow, figure: str) -> float:
    """The noise band a difference in ``figure`` between the two rows must leave: the wider of
    their two bands."""
    return max(row.band.get(figure, MIN_BAND), base.band.get(figure, MIN_BAND))


def pct(ratio: float) -> str:
    """A ratio as a change: 1.23 → "+23 %", 0.9 → "−10 %"."""
    change = (ratio - 1) * 100
    return f"{'+' if change >= 0 else '−'}{abs(change):.0f} %"
