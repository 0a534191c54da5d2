"""Self-contained HTML report of one benchmark run, or a comparison of several: tables and
inline SVG charts, no script, no external file, nothing fetched from the network."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from html import escape

from engines.bench.compare import METRICS, Comparison, cell, compare, run_label, verdict
from engines.bench.metrics import DEFINITIONS
from engines.bench.svg import Series, bar_chart, line_chart
from engines.events.bench import BenchLevel, BenchRun

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #111827; max-width: 1100px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #d1d5db; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f4f6; }
.meta { color: #374151; }
.warn { background: #fef3c7; border: 1px solid #f59e0b; padding: 6px 10px; }
.note { color: #4b5563; font-size: 12px; }
.better { color: #15803d; } .worse { color: #b91c1c; }
svg { margin: 0.5em 1em 0.5em 0; border: 1px solid #e5e7eb; }
"""

LEVEL_COLUMNS = (
    "concurrency",
    "completed",
    "failed",
    "duration s",
    *(m.label for m in METRICS if m.label != "failed"),
)


def render_report(runs: Sequence[BenchRun]) -> str:
    """The HTML page: one run's report, or a comparison when given several."""
    if not runs:
        raise ValueError("render_report needs at least one run")
    title = (
        f"traylm benchmark {run_label(runs[0])}"
        if len(runs) == 1
        else "traylm benchmark comparison: " + ", ".join(run_label(r) for r in runs)
    )
    body = [f"<h1>{escape(title)}</h1>"]
    if any(lv.telemetry.simulated for r in runs for lv in r.levels):
        body.append(
            '<p class="warn">Temperature, power and energy in this report come from SIMULATED '
            "GPUs (<code>traylm serve --simulate-gpus</code>), not from hardware.</p>"
        )
    body.append(f'<p class="note">{escape(DEFINITIONS)}</p>')
    if len(runs) > 1:
        body.extend(_comparison(compare(runs)))
    for run in runs:
        body.extend(_run_section(run, charts=len(runs) == 1))
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _when(ts_s: float | None) -> str:
    if ts_s is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts_s).strftime("%Y-%m-%d %H:%M:%S")


def _run_meta(run: BenchRun) -> str:
    c = run.config
    engine = run.engine
    engine_text = (
        f"{engine.get('engine', '')} {engine.get('version', '')} ({engine.get('device', '')}), "
        f"engine {engine.get('engine_id', '')}"
        if engine
        else "unknown engine"
    )
    rate = f"{c.rate_rps:g} req/s (Poisson)" if c.rate_rps > 0 else "all at once"
    prompts = {
        "tokenize": "prompt lengths exact (the engine's /tokenize)",
        "approx": "prompt lengths APPROXIMATE (no /tokenize: one word per token assumed)",
        "chat": "built-in chat prompts",
    }.get(run.prompt_source, run.prompt_source)
    return (
        f'<p class="meta">Model <b>{escape(c.model)}</b> at {escape(run.target)} — '
        f"{escape(engine_text)}. Workload <b>{escape(c.workload)}</b>: input {c.input_len}, "
        f"output {c.output_len} tokens, {escape(prompts)}; arrivals {escape(rate)}; "
        f"{c.warmup} warm-up request(s) per level left out. State <b>{escape(run.state)}</b>, "
        f"started {_when(run.created_s)}, finished {_when(run.finished_s)}."
        + (f" {escape(run.detail)}" if run.detail else "")
        + "</p>"
    )


def _level_row(level: BenchLevel) -> str:
    cells = [
        str(level.concurrency) + (" (cancelled)" if level.cancelled else ""),
        str(level.completed),
        str(level.failed),
        f"{level.duration_s:.2f}",
        *(cell(m.value(level), m.digits) for m in METRICS if m.label != "failed"),
    ]
    return "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>"


def _run_section(run: BenchRun, *, charts: bool) -> list[str]:
    out = [f"<h2>{escape(run_label(run))}</h2>", _run_meta(run)]
    if not run.levels:
        out.append("<p>No level was measured.</p>")
        return out
    out.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in LEVEL_COLUMNS) + "</tr>")
    out.extend(_level_row(lv) for lv in run.levels)
    out.append("</table>")
    out.append(_sources(run))
    out.extend(_telemetry_table(run))
    out.extend(_errors(run))
    if charts:
        out.extend(_run_charts(run))
    return out


def _sources(run: BenchRun) -> str:
    parts = []
    for lv in run.levels:
        tele = lv.telemetry.detail or ("no telemetry" if not lv.telemetry.available else "")
        parts.append(
            f"concurrency {lv.concurrency}: input tokens from {lv.input_tokens_source or '-'}, "
            f"output tokens from {lv.output_tokens_source or '-'}; {tele}"
        )
    return '<p class="note">' + "<br>".join(escape(p) for p in parts) + "</p>"


def _telemetry_table(run: BenchRun) -> list[str]:
    rows = []
    for lv in run.levels:
        for g in lv.telemetry.gpus:
            mem = (
                f"{g.memory_used_peak_bytes / 1024**3:.2f}"
                if g.memory_used_peak_bytes is not None
                else "-"
            )
            cells = [
                str(lv.concurrency),
                f"{g.index}: {g.name}",
                cell(g.temperature_peak_c, 0),
                cell(g.temperature_mean_c, 1),
                cell(g.power_mean_w, 1),
                cell(g.energy_j, 1),
                mem,
            ]
            rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    if not rows:
        return []
    head = ("concurrency", "GPU", "peak °C", "mean °C", "mean W", "energy J", "VRAM peak GiB")
    return [
        "<h3>GPUs</h3><table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>",
        *rows,
        "</table>",
    ]


def _errors(run: BenchRun) -> list[str]:
    rows = [
        f"<tr><td>{lv.concurrency}</td><td>{count}</td><td>{escape(message)}</td></tr>"
        for lv in run.levels
        for message, count in lv.errors.items()
    ]
    if not rows:
        return []
    return [
        "<h3>Errors</h3><table><tr><th>concurrency</th><th>count</th><th>error</th></tr>",
        *rows,
        "</table>",
    ]


def _ms(value: float | None) -> float | None:
    return value * 1000 if value is not None else None


def _by_concurrency(title: str, series: list[Series], y_label: str) -> str:
    cs = series[0].xs
    return line_chart(
        title,
        series,
        x_label="concurrency",
        y_label=y_label,
        x_ticks=cs,
        log_x=max(cs) / min(cs) >= 8,
    )


def _run_charts(run: BenchRun) -> list[str]:
    levels = run.levels
    out = []
    cs = [float(lv.concurrency) for lv in levels]
    if len(levels) > 1:
        out.append(
            _by_concurrency(
                "Throughput by concurrency",
                [
                    Series("output tok/s", cs, [lv.output_throughput_tps for lv in levels]),
                    Series("total tok/s", cs, [lv.total_throughput_tps for lv in levels]),
                ],
                "tokens/s",
            )
        )
        for title, attrs in (("TTFT", ("ttft",)), ("TPOT and ITL", ("tpot", "itl"))):
            series = [
                Series(
                    f"{attr.upper()} p{p}",
                    cs,
                    [_ms(getattr(lv, attr).percentiles_s.get(p)) for lv in levels],
                )
                for attr in attrs
                for p in ("50", "99")
            ]
            out.append(_by_concurrency(f"{title} by concurrency", series, "ms"))
    for lv in levels:
        ok = [r for r in lv.requests_detail if not r.error]
        starts = [r.start_s for r in ok]
        out.append(
            line_chart(
                f"Requests at concurrency {lv.concurrency}",
                [
                    Series("TTFT ms", starts, [_ms(r.ttft_s) for r in ok]),
                    Series("E2EL ms", starts, [_ms(r.e2el_s) for r in ok]),
                ],
                x_label="request sent at (s)",
                y_label="ms",
            )
        )
        t = lv.telemetry
        if t.available and len(t.ts_s) > 1:
            tag = " (SIMULATED)" if t.simulated else ""
            out.append(
                line_chart(
                    f"GPUs at concurrency {lv.concurrency}{tag}",
                    [
                        Series("hottest °C", t.ts_s, t.temperature_c),
                        Series("total W", t.ts_s, t.power_w),
                    ],
                    x_label="time in the level (s)",
                    y_label="°C / W",
                )
            )
    return out


def _comparison(comparison: Comparison) -> list[str]:
    runs = comparison.runs
    head = "<tr><th>concurrency</th><th>metric</th>" + "".join(
        f"<th>{escape(run_label(r))}</th>" for r in runs
    )
    out = ["<h2>Comparison</h2>", "<table>" + head + "</tr>"]
    for row in comparison.rows:
        cells = [f"<td>{row.concurrency}</td><td>{escape(row.metric.label)}</td>"]
        for i, value in enumerate(row.values):
            text = escape(cell(value, row.metric.digits))
            ratio = row.ratios[i]
            if i > 0 and ratio is not None:
                text += f' <span class="{verdict(row, i)}">({ratio:.2f}×)</span>'
            cells.append(f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    out.extend(f'<p class="note">{escape(n)}</p>' for n in comparison.notes)
    levels = sorted({row.concurrency for row in comparison.rows})
    for label in ("output tok/s", "TTFT p50 ms", "TPOT p50 ms", "J/token"):
        series = []
        for i, run in enumerate(runs):
            values = [
                next(
                    (
                        r.values[i]
                        for r in comparison.rows
                        if r.concurrency == c and r.metric.label == label
                    ),
                    None,
                )
                for c in levels
            ]
            series.append((run_label(run), values))
        if any(v is not None for _, vs in series for v in vs):
            out.append(
                bar_chart(
                    label,
                    [str(c) for c in levels],
                    series,
                    x_label="concurrency",
                    y_label=label,
                )
            )
    return out
