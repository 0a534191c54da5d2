"""The tuner's result as a self-contained HTML page (GET /api/tune/report, `traylm tune
--html`): the bench report's style and bar charts (engines/bench/report.py, svg.py), this
machine's table, the Pareto set and the recommendation."""

from __future__ import annotations

from html import escape

from engines.bench.report import STYLE
from engines.bench.svg import bar_chart
from engines.events.tune import TuneJob
from engines.tune.table import cost_text, shown_figures, value_text


def render_tune(job: TuneJob) -> str:
    title = f"traylm tune #{job.id}: {job.profile}"
    c = job.config
    workload = escape(c.workload_file if c.workload == "file" else f"preset {c.workload}")
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">{job.state}; workload {workload}, concurrency {job.concurrency}, '
        f"goal {escape(c.goal)}, {c.repeat} runs of each candidate, interleaved. "
        f"{escape(job.detail)}</p>",
    ]
    if job.simulated:
        body.append('<p class="warn">GPU figures come from SIMULATED GPUs.</p>')
    if job.recommendation:
        body.append(f"<h2>Recommendation</h2><p>{escape(job.recommendation)}</p>")
    figures = shown_figures(job)
    head = "".join(f"<th>{escape(f.label)}</th>" for f in figures)
    body.append(
        f"<h2>Candidates</h2><table><tr><th>candidate</th>{head}<th>per 100 M tokens</th>"
        "<th>verdict</th><th>Pareto</th><th>changes</th></tr>"
    )
    for r in job.rows:
        cells = "".join(f"<td>{escape(value_text(r, f))}</td>" for f in figures)
        css = {"better": "better", "worse": "worse"}.get(r.verdict, "")
        verdict = r.verdict if r.runs else f"failed: {r.error}"
        body.append(
            f"<tr><td>{escape(r.label)}</td>{cells}<td>{escape(cost_text(r, job.currency))}"
            f'</td><td class="{css}">{escape(verdict)}</td><td>{"yes" if r.pareto else ""}</td>'
            f"<td>{escape('; '.join(r.changes))}</td></tr>"
        )
    body.append("</table>")
    body.append(
        '<p class="note">± is the spread of the repeats: half their range, relative to their '
        "mean (after one run there is none). A candidate is better or worse only outside the "
        "wider of its and your profile's spread (2 % at least).</p>"
    )
    if job.dropped:
        items = "".join(f"<li>{escape(d)}</li>" for d in job.dropped)
        body.append(f"<h2>Not measured</h2><ul>{items}</ul>")
    measured = [r for r in job.rows if r.runs]
    for key, label in (("output_tps", "output tokens/s"), ("ttft_p95_ms", "TTFT p95 ms")):
        body.append(
            bar_chart(
                label,
                [r.key for r in measured],
                [(label, [r.figures.get(key) for r in measured])],
                x_label="candidate",
                y_label=label,
            )
        )
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
