"""Side-by-side figures of several runs, level by level (same concurrency), with ratios to the
first run. Used by `traylm bench compare` (text) and the HTML report (a table)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engines.events.bench import BenchLevel, BenchRun, LatencyStats

GIB = 1024**3


def _pct_ms(stats: LatencyStats, key: str) -> float | None:
    value = stats.percentiles_s.get(key)
    return value * 1000 if value is not None else None


def _mean_ms(stats: LatencyStats) -> float | None:
    return stats.mean_s * 1000 if stats.mean_s is not None else None


@dataclass(frozen=True)
class Metric:
    label: str
    better: str  # "higher" | "lower"
    value: Callable[[BenchLevel], float | None]
    digits: int = 1


METRICS: tuple[Metric, ...] = (
    Metric("output tok/s", "higher", lambda lv: lv.output_throughput_tps),
    Metric("total tok/s", "higher", lambda lv: lv.total_throughput_tps),
    Metric("requests/s", "higher", lambda lv: lv.request_throughput_rps, 2),
    Metric("TTFT mean ms", "lower", lambda lv: _mean_ms(lv.ttft)),
    Metric("TTFT p50 ms", "lower", lambda lv: _pct_ms(lv.ttft, "50")),
    Metric("TTFT p99 ms", "lower", lambda lv: _pct_ms(lv.ttft, "99")),
    Metric("TPOT p50 ms", "lower", lambda lv: _pct_ms(lv.tpot, "50"), 2),
    Metric("TPOT p99 ms", "lower", lambda lv: _pct_ms(lv.tpot, "99"), 2),
    Metric("ITL p50 ms", "lower", lambda lv: _pct_ms(lv.itl, "50"), 2),
    Metric("ITL p99 ms", "lower", lambda lv: _pct_ms(lv.itl, "99"), 2),
    Metric("E2EL p50 ms", "lower", lambda lv: _pct_ms(lv.e2el, "50")),
    Metric("E2EL p99 ms", "lower", lambda lv: _pct_ms(lv.e2el, "99")),
    Metric("failed", "lower", lambda lv: float(lv.failed), 0),
    Metric("peak °C", "lower", lambda lv: lv.telemetry.temperature_peak_c, 0),
    Metric("peak fan %", "lower", lambda lv: lv.telemetry.fan_speed_peak_pct, 0),
    Metric("mean W", "lower", lambda lv: lv.telemetry.power_mean_w),
    Metric("J/token", "lower", lambda lv: lv.telemetry.joules_per_token, 3),
    Metric(
        "VRAM peak GiB",
        "lower",
        lambda lv: (
            lv.telemetry.memory_used_peak_bytes / GIB
            if lv.telemetry.memory_used_peak_bytes is not None
            else None
        ),
        2,
    ),
)


@dataclass(frozen=True)
class CompareRow:
    concurrency: int
    metric: Metric
    values: tuple[float | None, ...]  # one per run
    ratios: tuple[float | None, ...]  # value / the first run's value


@dataclass(frozen=True)
class Comparison:
    runs: tuple[BenchRun, ...]
    rows: tuple[CompareRow, ...]
    notes: tuple[str, ...]


def compare(runs: Sequence[BenchRun]) -> Comparison:
    """Rows for every concurrency level all runs measured; notes say what does not line up."""
    notes: list[str] = []
    by_run = [{lv.concurrency: lv for lv in run.levels} for run in runs]
    common = sorted(set.intersection(*(set(m) for m in by_run))) if by_run else []
    others = sorted(set().union(*(set(m) for m in by_run)) - set(common)) if by_run else []
    if others:
        notes.append(
            "concurrency levels not measured by every run are left out: "
            + ", ".join(map(str, others))
        )
    shapes = {(r.config.workload, r.config.input_len, r.config.output_len) for r in runs}
    if len(shapes) > 1:
        notes.append("the runs used different workloads or lengths: compare with care")
    if any(lv.telemetry.simulated for r in runs for lv in r.levels):
        notes.append("temperature, power and energy come from SIMULATED GPUs")
    rows = []
    for c in common:
        levels = [m[c] for m in by_run]
        for metric in METRICS:
            values = tuple(metric.value(lv) for lv in levels)
            base = values[0]
            ratios = tuple(
                v / base if v is not None and base not in (None, 0) else None for v in values
            )
            rows.append(CompareRow(c, metric, values, ratios))
    return Comparison(tuple(runs), tuple(rows), tuple(notes))


def verdict(row: CompareRow, index: int) -> str:
    """ "better" / "worse" / "" for run ``index`` against the first run (1 % dead band)."""
    ratio = row.ratios[index]
    if ratio is None or abs(ratio - 1) < 0.01:
        return ""
    higher = ratio > 1
    return "better" if higher == (row.metric.better == "higher") else "worse"


def cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def run_label(run: BenchRun) -> str:
    return f"#{run.id} {run.name}".strip() if run.name else f"#{run.id}"


def format_table(comparison: Comparison) -> str:
    """The comparison as plain text, one block per concurrency level."""
    runs = comparison.runs
    labels = [run_label(r)[:22] for r in runs]
    width = max(12, *(len(label) for label in labels))
    lines = [
        f"{'':<16}"
        + "".join(f"{label:>{width + 2 + (9 if i else 0)}}" for i, label in enumerate(labels))
    ]
    for r in runs:
        engine = r.engine
        lines.append(
            f"  {run_label(r)}: {r.config.model} via {r.target or '-'} "
            f"{engine.get('engine', '')} {engine.get('version', '')} "
            f"{r.config.workload} in {r.config.input_len}/out {r.config.output_len}"
        )
    current = None
    for row in comparison.rows:
        if row.concurrency != current:
            current = row.concurrency
            lines.append(f"\nconcurrency {current}")
        cells = []
        for i, value in enumerate(row.values):
            text = cell(value, row.metric.digits)
            ratio = row.ratios[i]
            if i > 0:
                mark = {"better": "+", "worse": "-"}.get(verdict(row, i), "=")
                text += f" {ratio:6.2f}x{mark}" if ratio is not None else " " * 9
            cells.append(f"{text:>{width + 2 + (9 if i > 0 else 0)}}")
        lines.append(f"  {row.metric.label:<14}" + "".join(cells))
    if not comparison.rows:
        lines.append("\nno concurrency level was measured by every run")
    lines.extend(f"note: {n}" for n in comparison.notes)
    lines.append("ratios are run / first run; + better, - worse, = within 1 %")
    return "\n".join(lines)
