"""The guarded upgrade's verdict: the new version takes over only when none of the pinned
figures got worse by more than ``LIMIT``, nor by more than the noise band the tuner measured
for it (engines/tune/verdict.py: the wider band of the two rows). A worse figure inside the
noise band is not called worse: two runs of the same engine differ that much already.

Pinned: the workload's latency and throughput figures (TTFT p50/p95, TPOT p50, output tokens/s,
requests/s), failed requests, and where GPUs are measured, VRAM and joules per token. The cold
start is shown but not pinned: it is one start, not the traffic the engine serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engines.events.tune import TuneJob, TuneRow, TuneState
from engines.tune.figures import BY_KEY
from engines.tune.verdict import band_of, pct

LIMIT = 0.05
PINNED = (
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_p50_ms",
    "output_tps",
    "request_rps",
    "vram_peak_gib",
    "joules_per_token",
)


@dataclass(frozen=True)
class Verdict:
    switch: bool
    measured: bool  # False: the comparison could not be made (the old one failed, no time)
    worse: tuple[str, ...]  # each pinned figure worse past its limit, in words
    changes: Mapping[str, float]  # new / old per pinned figure measured on both
    words: str  # why, in one line


def judge(tune: TuneJob, new_key: str) -> Verdict:
    """The verdict on the tune of the old version (row "default") against ``new_key``."""
    rows = {r.key: r for r in tune.rows}
    old, new = rows.get("default"), rows.get(new_key)
    if tune.state != TuneState.DONE or old is None:
        return Verdict(False, False, (), {}, tune.detail or "the version in use was not measured")
    if new is None or not new.runs:
        error = new.error if new is not None else "not measured"
        return Verdict(False, True, (), {}, f"the new version did not run: {error}")
    if new.runs < 2 or old.runs < 2:
        return Verdict(
            False,
            True,
            (),
            {},
            "measured once only, so no noise band to judge by: give a larger --budget",
        )
    changes = {k: new.ratios[k] for k in PINNED if k in new.ratios}
    worse = [w for k in changes if (w := _worse(k, old, new))]
    if new.figures.get("failed", 0) > old.figures.get("failed", 0):
        worse.append(
            f"failed requests {old.figures.get('failed', 0):.0f} → {new.figures['failed']:.0f}"
        )
    if worse:
        return Verdict(False, True, tuple(worse), changes, "; ".join(worse))
    shown = ", ".join(f"{BY_KEY[k].label} {pct(v)}" for k, v in changes.items())
    return Verdict(
        True,
        True,
        (),
        changes,
        f"no pinned figure worse by more than {LIMIT:.0%} or its noise band ({shown})",
    )


def _worse(key: str, old: TuneRow, new: TuneRow) -> str:
    """``key`` in words if it got worse past its limit, else ""."""
    figure = BY_KEY[key]
    ratio = new.ratios[key]
    worse_by = ratio - 1 if figure.better == "lower" else 1 - ratio
    limit = max(LIMIT, band_of(new, old, key))
    if worse_by <= limit:
        return ""
    d = figure.digits
    return (
        f"{figure.label} worse by {worse_by:.0%} ({old.figures[key]:.{d}f} → "
        f"{new.figures[key]:.{d}f}; limit {limit:.0%})"
    )
