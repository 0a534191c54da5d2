"""The tuner's result as text (`traylm tune`), from the job alone: no aiohttp, no daemon."""

from __future__ import annotations

from engines.events.tune import TuneJob, TuneRow
from engines.tune.figures import FIGURES, Figure

SHOWN = (
    "output_tps",
    "request_rps",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_p50_ms",
    "vram_peak_gib",
    "temperature_peak_c",
    "power_mean_w",
    "joules_per_token",
    "cold_start_s",
)


def shown_figures(job: TuneJob) -> list[Figure]:
    """The figures measured for at least one row (no GPU columns on a CPU machine)."""
    return [f for f in FIGURES if f.key in SHOWN and any(f.key in r.figures for r in job.rows)]


def value_text(row: TuneRow, f: Figure) -> str:
    """ "1234.5 ±3%" (the runs' spread), "1234.5 one run: no spread", "-" when not measured."""
    return row.figure_text(f.key, f.digits)


def cost_text(row: TuneRow, currency: str) -> str:
    return f"{row.cost_per_100m:.2f} {currency}" if row.cost_per_100m is not None else "-"


def table_lines(job: TuneJob) -> list[str]:
    """The rows as an aligned text table (each line indented), [] when none was measured."""
    if not job.rows:
        return []
    figures = shown_figures(job)
    header = ["candidate", *(f.label for f in figures), "per 100M tok", "verdict"]
    table = [header]
    for r in job.rows:
        verdict = r.verdict + (" *" if r.pareto else "")
        if r.error and not r.runs:
            verdict = f"failed: {r.error}"
        table.append(
            [r.label, *(value_text(r, f) for f in figures), cost_text(r, job.currency), verdict]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = []
    for row in table:
        cells = [
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append("  " + "  ".join([*cells, row[-1]]))
    return lines


def format_job(job: TuneJob) -> str:
    c = job.config
    workload = c.workload_file if c.workload == "file" else f"preset {c.workload}"
    lines = [
        f"tune #{job.id} of {job.profile}: {job.state}"
        + (f" ({job.detail})" if job.detail else ""),
        f"  workload {workload}, concurrency {job.concurrency}, goal {c.goal}, "
        f"{c.repeat} runs each, interleaved",
    ]
    lines += table_lines(job)
    if job.rows:
        lines.append("  * on the Pareto front (tokens/s, TTFT p95, J/token); ±: the runs' spread")
    if job.planned:
        done = sum(1 for m in job.measures if not m.error)
        lines.append(f"  {done} of {job.planned} measurements planned were made")
    for line in job.dropped:
        lines.append(f"  not measured: {line}")
    if job.recommendation:
        lines.append(f"recommendation: {job.recommendation}")
    winner = next((r for r in job.rows if r.key == job.recommended), None)
    if winner is not None:
        lines.append("  profile changes: " + "; ".join(winner.changes))
        if not job.applied:
            lines.append(f"  write them with `traylm tune {job.profile} --apply` (run again)")
    return "\n".join(lines)
