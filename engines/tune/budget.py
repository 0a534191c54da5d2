"""How many candidates a time budget holds.

Before anything starts, the budget must hold the least run that can decide anything: the
default and one candidate, each measured ``repeat`` times, each measurement a cold start (the
model's last start here, else a typical one). Once the default has been measured once, the cost
of a measurement is known (its cold start + the workload's time + the stop) and the candidates
that do not fit what is left are dropped, the last ones first.
"""

from __future__ import annotations

import math

from engines.errors import TuneError

TYPICAL_COLD_START_S = {"cpu": 60.0, "cuda": 90.0}
"""A start of vLLM when this model has not started here yet (notes/cpu-engine.md: 48 s for the
tiny model on 2 cores; a 7-8B model on one GPU takes about as long again)."""


STOP_ALLOWANCE_S = 10.0
"""A stop and the next placement, in each measurement's cost."""


def per_run_estimate_s(cold_start_s: float) -> float:
    """A measurement's time before one was made: a start, the workload about as long again, and
    the stop (what the first measurement's time, which corrects it, is counted as)."""
    return 2 * cold_start_s + STOP_ALLOWANCE_S


def least_budget_s(repeat: int, cold_start_s: float) -> float:
    """The smallest budget a tune here works with: ``repeat`` measurements each of the default
    and one candidate."""
    return 2 * repeat * per_run_estimate_s(cold_start_s)


def least_words(repeat: int, cold_start_s: float) -> str:
    """The least budget in words, for the app and the command line alike (no option names)."""
    least_s = least_budget_s(repeat, cold_start_s)
    return f"the smallest budget that fits 2 candidates is {duration(least_s)}"


def check_minimum(budget_s: float, repeat: int, cold_start_s: float) -> None:
    """TuneError (code tune_budget) when the budget cannot hold ``repeat`` measurements of the
    default and a candidate; GET /api/tune/budget gives the least one as a number."""
    if budget_s < least_budget_s(repeat, cold_start_s):
        raise TuneError(
            f"a budget of {duration(budget_s)} cannot hold {repeat} measurements each of your "
            f"profile and one candidate: each starts the engine, which takes about "
            f"{cold_start_s:.0f} s here; {least_words(repeat, cold_start_s)}",
            code="tune_budget",
        )


def candidates_that_fit(
    *, left_s: float, per_run_s: float, repeat: int, candidates: int, default_runs_left: int
) -> int:
    """How many candidates (besides the default) fit in ``left_s``; TuneError when none does."""
    runs = math.floor(left_s / per_run_s) - default_runs_left
    fit = min(candidates, max(0, runs // repeat))
    if fit < 1 and candidates:
        raise TuneError(
            f"one measurement takes {per_run_s:.0f} s here (start, workload, stop), so the "
            f"{duration(left_s)} left cannot hold {repeat} measurements of a candidate; give a "
            f"larger budget (about {duration(per_run_s * repeat * 4)} for three candidates) "
            "or fewer requests a run"
        )
    return fit


def duration(seconds: float) -> str:
    """ "8 min", "45 s": in words, as the app and the command line say it."""
    if seconds >= 120:
        return f"{math.ceil(seconds / 60)} min"
    return f"{math.ceil(seconds)} s"
