"""The suite's time budget: each test's duration as it ran, and a report against the budget.

While pytest runs with ``TRAYLM_TEST_TIMINGS=FILE`` set, every test appends one JSON line to
FILE (its node id, phase durations summed, whether it is an engine test, its outcome); under
pytest-xdist the controller writes them all as the workers' reports reach it. tests/run.sh sets it
and, at the end, prints the report::

    python -m tests.timings FILE --wall-s SECONDS --budget-s SECONDS

The report: the whole run's wall time against its budget, the ten slowest tests, every engine
test's time, and the tests that took more than ``UNMARKED_SLOW_S`` without the ``slow`` marker
(``--quick`` leaves the slow ones out: an unmarked slow test lands in the quick run's budget),
so that a slow test is seen in the run where it lands. It exits 0 whatever the figures: the
budget is watched, not asserted (a loaded machine is slower).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "TRAYLM_TEST_TIMINGS"
UNMARKED_SLOW_S = 4.0
"""A test slower than this in the full run (3 workers on 2 cores: about twice its time alone)
belongs under ``@pytest.mark.slow``, out of ``--quick``."""


@dataclass(frozen=True)
class Timing:
    nodeid: str
    seconds: float
    engine: bool
    outcome: str
    slow: bool = False


_SO_FAR: dict[str, tuple[float, bool]] = {}
"""Each running test's setup and call seconds so far, and whether a phase failed."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append the test's time once its teardown is done (a hook tests/conftest.py imports)."""
    path = os.environ.get(ENV)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under xdist the controller, which gets every worker's reports, writes
    seconds, failed = _SO_FAR.pop(report.nodeid, (0.0, False))
    seconds, failed = seconds + report.duration, failed or report.failed
    if report.when != "teardown":
        _SO_FAR[report.nodeid] = (seconds, failed)
        return
    row = {
        "nodeid": report.nodeid,
        "seconds": round(seconds, 3),
        "engine": "engine" in report.keywords,
        "outcome": "failed" if failed else "passed",
        "slow": "slow" in report.keywords,
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def read(path: Path) -> list[Timing]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            raw = json.loads(line)
            timing = Timing(
                raw["nodeid"],
                float(raw["seconds"]),
                bool(raw["engine"]),
                str(raw["outcome"]),
                bool(raw.get("slow", False)),
            )
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a killed worker
        rows.append(timing)
    return rows


def report(rows: Sequence[Timing], *, wall_s: float, budget_s: float) -> str:
    total = sum(r.seconds for r in rows)
    verdict = "within" if wall_s <= budget_s else "OVER"
    out = [
        f"== time: {_mmss(wall_s)} wall for the whole run, {verdict} its budget of "
        f"{_mmss(budget_s)}; {len(rows)} tests took {_mmss(total)} of test time in all",
        "   the ten slowest tests:",
    ]
    out += [
        f"   {r.seconds:8.1f} s  {r.nodeid}" for r in sorted(rows, key=lambda r: -r.seconds)[:10]
    ]
    engine = [r for r in rows if r.engine]
    if engine:
        out.append(f"   the {len(engine)} engine tests ({_mmss(sum(r.seconds for r in engine))}):")
        out += [
            f"   {r.seconds:8.1f} s  {r.nodeid}" for r in sorted(engine, key=lambda r: -r.seconds)
        ]
    unmarked = sorted(
        (r for r in rows if r.seconds > UNMARKED_SLOW_S and not r.slow and not r.engine),
        key=lambda r: -r.seconds,
    )
    if unmarked:
        out.append(
            f"   {len(unmarked)} tests over {UNMARKED_SLOW_S:g} s not marked slow (they run in "
            "--quick): mark them @pytest.mark.slow or make them faster"
        )
        out += [f"   {r.seconds:8.1f} s  {r.nodeid}" for r in unmarked[:10]]
    return "\n".join(out)


def _mmss(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.timings", description=__doc__)
    parser.add_argument("file", type=Path, help="the timings file the run wrote")
    parser.add_argument("--wall-s", type=float, required=True, help="the run's wall time")
    parser.add_argument("--budget-s", type=float, required=True, help="the run's budget")
    args = parser.parse_args(argv)
    print(report(read(args.file), wall_s=args.wall_s, budget_s=args.budget_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
