"""tests/timings.py: the per-test times a run records and the budget report it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.timings import ENV, Timing, read, report

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_records_each_test_once_with_its_phases_summed(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text(
        "import time, pytest\n"
        "@pytest.fixture\n"
        "def slow_setup():\n"
        "    time.sleep(0.3)\n"
        "def test_quick(): pass\n"
        "@pytest.mark.slow\n"
        "def test_slow(slow_setup): time.sleep(0.2)\n"
        "def test_bad(): assert False\n"
    )
    (tmp_path / "conftest.py").write_text(
        "from tests.timings import pytest_runtest_logreport  # noqa: F401\n"
    )
    out = tmp_path / "timings.jsonl"
    outer = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST")
    env = {k: v for k, v in os.environ.items() if k not in outer}  # not an xdist worker
    env.update({ENV: str(out), "PYTHONPATH": str(ROOT)})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1, run.stdout  # test_bad fails
    rows = {r.nodeid.split("::")[-1]: r for r in read(out)}
    assert sorted(rows) == ["test_bad", "test_quick", "test_slow"]
    assert rows["test_slow"].seconds >= 0.5  # setup 0.3 + call 0.2
    assert rows["test_quick"].seconds < rows["test_slow"].seconds
    assert rows["test_slow"].slow and not rows["test_quick"].slow  # the marker, recorded
    assert (rows["test_bad"].outcome, rows["test_quick"].outcome) == ("failed", "passed")


def test_the_report_names_the_slowest_and_every_engine_test() -> None:
    rows = [Timing(f"t.py::test_{i}", float(i), i in (3, 12), "passed", True) for i in range(15)]
    text = report(rows, wall_s=500, budget_s=480)
    lines = text.splitlines()
    assert "8:20 wall for the whole run, OVER its budget of 8:00" in lines[0]
    assert "15 tests took 1:45 of test time" in lines[0]
    slowest = lines[2:12]
    assert [line.split()[-1] for line in slowest] == [f"t.py::test_{i}" for i in range(14, 4, -1)]
    assert "the 2 engine tests (0:15):" in text
    assert [line.split() for line in lines[-2:]] == [
        ["12.0", "s", "t.py::test_12"],
        ["3.0", "s", "t.py::test_3"],
    ]
    assert "within its budget" in report(rows, wall_s=100, budget_s=480)


def test_the_report_names_slow_tests_without_the_slow_marker(tmp_path: Path) -> None:
    """--quick leaves out the tests marked slow; one over the mark without it is named."""
    lines = [
        '{"nodeid": "t.py::test_marked", "seconds": 9.0, "engine": false, "outcome": "passed", '
        '"slow": true}',
        '{"nodeid": "t.py::test_forgot", "seconds": 7.5, "engine": false, "outcome": "passed", '
        '"slow": false}',
        '{"nodeid": "t.py::test_old_line", "seconds": 5.0, "engine": false, "outcome": "passed"}',
        '{"nodeid": "t.py::test_quick", "seconds": 0.5, "engine": false, "outcome": "passed", '
        '"slow": false}',
        '{"nodeid": "t.py::test_vllm", "seconds": 60.0, "engine": true, "outcome": "passed", '
        '"slow": true}',
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    text = report(read(tmp_path / "t.jsonl"), wall_s=100, budget_s=480)
    tail = text.split("not marked slow", 1)[1].splitlines()
    assert text.count("not marked slow") == 1 and "2 tests over 4 s" in text
    assert [line.split()[-1] for line in tail[1:]] == ["t.py::test_forgot", "t.py::test_old_line"]
