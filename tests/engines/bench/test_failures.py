"""A failed benchmark says why where the user looks, through the real daemon and the FAKE vLLM
engine: each failed request is in the flight recorder marked as the benchmark run's, with the
benchmark's reason, and the run's log names the failed requests and their reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.bench.cli import format_run
from engines.events import BenchConfig, BenchState
from tests.conftest import RunningDaemon
from tests.engines.bench.test_daemon import run_to_end, sim_daemon  # noqa: F401 - a fixture
from tests.engines.gateway.test_daemon_gateway import start_fake

pytestmark = pytest.mark.slow


async def test_a_reply_without_text_is_in_requests_and_the_log_with_its_reason(
    sim_daemon: RunningDaemon,  # noqa: F811 - the fixture
) -> None:
    d = sim_daemon
    await start_fake(d, args="--no-text")
    config = BenchConfig(model="fake", concurrency=(1,), requests=2, warmup=0, output_len=4)
    run, _ = await run_to_end(d, config)
    assert run.state == BenchState.FAILED
    (level,) = run.levels
    assert dict(level.errors) == {"the reply carried no text": 2}
    failed = [r for r in level.requests_detail if r.error]
    assert len(failed) == 2 and all(r.request_id.startswith("req_") for r in failed)

    rows = await d.client.requests_list(client="bench")
    assert {r["id"] for r in rows} == {r.request_id for r in failed}
    for row in rows:
        assert row["peer"] == f"run #{run.id}" and row["status"] == 200
        assert row["error"] == f"benchmark run #{run.id}: the reply carried no text"
    detail = await d.client.request_detail(failed[0].request_id)
    assert detail["client"] == "bench" and "no text" in detail["error"]

    log = Path(run.log_path)
    assert log.parent == d.paths.logs_dir / "bench"
    text = log.read_text()
    for r in failed:
        assert f"{r.request_id}: the reply carried no text" in text
    assert f"run #{run.id} failed: no request completed: the reply carried no text" in text
    assert f"log (each failed request; `traylm requests ls --client bench`): {log}" in (
        format_run(run)  # `traylm bench show`
    )


async def test_a_timed_out_request_keeps_its_status_and_gets_the_reason(
    sim_daemon: RunningDaemon,  # noqa: F811 - the fixture
) -> None:
    d = sim_daemon
    await start_fake(d, args="--token-delay 0.2")
    config = BenchConfig(  # each reply takes 1.6 s: past the request timeout
        model="fake", concurrency=(1,), requests=1, warmup=0, output_len=8, request_timeout_s=0.4
    )
    run, _ = await run_to_end(d, config)
    (failed,) = [r for r in run.levels[0].requests_detail if r.error]
    row = await d.client.request_detail(failed.request_id)
    assert row["client"] == "bench" and row["status"] == 499  # the benchmark hung up
    assert row["error"] == f"benchmark run #{run.id}: no complete reply within 0.4 s"
    assert f"{failed.request_id}: no complete reply within 0.4 s" in Path(run.log_path).read_text()
    # a user's own request is not the benchmark's
    assert not await d.client.requests_list(client="local")
