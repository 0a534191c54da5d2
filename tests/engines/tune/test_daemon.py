"""`traylm tune` through the real daemon: candidates started as FAKE vLLM engines (the FAKE
engine honours --max-num-seqs as vLLM's scheduler does, so candidates really differ), measured
by real bench runs through the gateway, interleaved, decided, applied and undone; cancel, a
crash mid-tune and bad input each end with what ran before running again, no candidate engine
left and the profile file untouched."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from engines.events import EngineState, TuneConfig, TuneFinished, TuneJob, TuneProgress, TuneState
from engines.gateway.security import hash_key
from engines.gpu.sim import sim_uuid
from engines.tune.cli import CANCEL_ANSWER_S
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.gpu.test_daemon import feature, sim_settings
from tests.engines.runtime.test_warm_starts import wait_until
from tests.fakes.fake_vllm_env import make_fake_vllm_env
from tests.traylm_cli import traylm

pytestmark = pytest.mark.slow
TOKEN_S = 0.005  # 128 tokens a reply: 0.64 s; max-num-seqs 2 at 8 in flight: 4 waves


@pytest.fixture
async def d(daemon_factory: Any, fake_env: Path) -> RunningDaemon:
    result: RunningDaemon = await daemon_factory()
    return result


def profile_file(d: RunningDaemon, name: str = "chat") -> Path:
    return d.paths.profiles_dir / f"{name}.toml"


async def tune_to_end(d: RunningDaemon, config: TuneConfig, *, cancel_at: str = "") -> TuneJob:
    """Start a tune and wait for its end (cancelling it at the first progress of phase
    ``cancel_at``); the job as GET /api/tune has it."""
    with d.daemon.bus.subscribe(frozenset({"tune"})) as sub:
        job = await d.client.tune_start(config)
        while True:
            event = await asyncio.wait_for(sub.get(), 120)
            if isinstance(event, TuneProgress) and cancel_at and event.phase == cancel_at:
                cancelled = await d.client.tune_cancel()
                assert cancelled.state == TuneState.CANCELLED
            if isinstance(event, TuneFinished) and event.job_id == job.id:
                break
    final = await d.client.tune_current()
    assert final is not None
    return final


async def nothing_of_the_tune_left(d: RunningDaemon, running: set[str]) -> None:
    """Only ``running`` engines run (ready), and no candidate engine is known."""
    for name in running:
        status = await d.client.wait_for_engine(name, (EngineState.READY, EngineState.FAILED), 20)
        assert status.state == EngineState.READY, status.detail
    engines = {e.engine_id: e.state for e in await d.client.engines()}
    assert "tune-chat" not in engines
    assert {k for k, v in engines.items() if v != EngineState.STOPPED} == running


async def test_tune_measures_interleaved_picks_the_faster_applies_and_undoes(
    d: RunningDaemon,
) -> None:
    await start_fake(d, "chat", args=f"--token-delay {TOKEN_S}", max_num_seqs=2)
    before = profile_file(d).read_bytes()
    config = TuneConfig(
        model="chat", concurrency=8, requests=8, only=("max-num-seqs-32",), apply=True
    )
    job = await tune_to_end(d, config)
    assert job.state == TuneState.DONE, job.detail
    # A B A B: the repeats interleave, each a real bench run of its own
    assert [(m.candidate, m.round) for m in job.measures] == [
        ("default", 0), ("max-num-seqs-32", 0), ("default", 1), ("max-num-seqs-32", 1),
    ]  # fmt: skip
    runs = {m.bench_run_id for m in job.measures}
    assert None not in runs and len(runs) == 4
    rows = {r.key: r for r in job.rows}
    assert rows["default"].verdict == "default"
    faster = rows["max-num-seqs-32"]
    assert faster.verdict == "better", (faster, rows["default"])
    assert faster.ratios["output_tps"] > 2  # 4 waves against 1
    assert faster.band["output_tps"] < 0.5
    assert job.recommended == "max-num-seqs-32"
    assert job.recommendation.startswith("max-num-seqs 32: ")
    assert "x the tokens/s of your profile at concurrency 8" in job.recommendation
    assert all(m.cold_start_s and m.cold_start_s > 0 for m in job.measures)
    # applied: the file says 32, the old one is kept; undo puts back the very same bytes
    assert job.applied
    assert "max_num_seqs = 32" in profile_file(d).read_text()
    await nothing_of_the_tune_left(d, {"chat"})
    html = await d.client.tune_report_html()
    assert "max-num-seqs 32" in html and "<svg" in html
    detail = await d.client.tune_undo("chat")
    assert "before" in detail
    assert profile_file(d).read_bytes() == before
    with pytest.raises(ControlAPIError, match="nothing to undo"):
        await d.client.tune_undo("chat")


async def test_two_replicas_are_a_candidate_whose_copies_both_serve(d: RunningDaemon) -> None:
    """Replicas as a candidate: two FAKE engines of max-num-seqs 2 each behind the served name
    make twice the streams of one (4 in flight at once against 2), so the gateway balanced the
    workload over both; both are gone after the tune."""
    await start_fake(d, "chat", args=f"--token-delay {TOKEN_S}", max_num_seqs=2)
    config = TuneConfig(model="chat", concurrency=4, requests=8, only=("replicas-2",))
    job = await tune_to_end(d, config)
    assert job.state == TuneState.DONE, job.detail
    rows = {r.key: r for r in job.rows}
    assert rows["replicas-2"].ratios["output_tps"] > 1.5, (rows["replicas-2"], rows["default"])
    await nothing_of_the_tune_left(d, {"chat"})
    assert not any(e.engine_id.startswith("tune-chat") for e in await d.client.engines())


async def test_candidates_start_cold_and_the_users_warm_process_restores_the_engine(
    d: RunningDaemon,
) -> None:
    """A candidate's cold start is a measured figure, and a warm process made when a candidate
    is ready would take the CPU from its measurement and the pool's place from the user's."""
    await start_fake(d, "chat", args="--token-delay 0.002")
    pool = d.daemon.warm
    await wait_until(lambda: "chat" in pool)
    (warm_pid,) = pool.pids()
    config = TuneConfig(model="chat", concurrency=2, requests=4, only=("max-num-seqs-8",))
    job = await tune_to_end(d, config)
    assert job.state == TuneState.DONE, job.detail
    log = (d.paths.logs_dir / "engines" / "tune-chat.log").read_text()
    assert log.count("===== argv:") == 4 and "in warm process" not in log  # 2 x 2, all cold
    await nothing_of_the_tune_left(d, {"chat"})
    status = await d.client.wait_for_engine("chat", (EngineState.READY,), 20)
    assert status.pid == warm_pid  # what ran before came back in its own warm process


async def test_cancel_restores_the_engine_that_ran_and_leaves_the_profile(
    d: RunningDaemon,
) -> None:
    await start_fake(d, "chat", args="--token-delay 0.05")
    before = profile_file(d).read_bytes()
    config = TuneConfig(model="chat", concurrency=2, requests=40, only=("max-num-seqs-8",))
    job = await tune_to_end(d, config, cancel_at="measure")
    assert job.state == TuneState.CANCELLED
    assert not job.rows and not job.applied
    await nothing_of_the_tune_left(d, {"chat"})
    assert profile_file(d).read_bytes() == before


async def test_an_engine_crashing_mid_tune_fails_it_clearly_and_restores(
    d: RunningDaemon,
) -> None:
    await start_fake(d, "chat", args="--crash-after-requests 3 --token-delay 0.01")
    before = profile_file(d).read_bytes()
    config = TuneConfig(model="chat", concurrency=2, requests=8, only=("max-num-seqs-8",))
    job = await tune_to_end(d, config)
    assert job.state == TuneState.FAILED
    assert "your profile chat itself failed: the engine crashed during the measurement" in (
        job.detail
    )
    await nothing_of_the_tune_left(d, {"chat"})
    assert profile_file(d).read_bytes() == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"budget_s": 3.0}, "cannot hold 2 measurements each of your profile and one candidate"),
        ({"repeat": 1}, "the noise band needs at least two runs"),
        ({"workload": "file", "workload_file": "NOT_JSONL"}, "NOT_JSONL:1: not JSON"),
        ({"model": "nope"}, "nothing to tune named 'nope'"),
        ({"only": ("warp-drive",)}, "no candidate warp-drive here"),
    ],
)
async def test_bad_input_is_refused_before_anything_stops(
    d: RunningDaemon, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    await start_fake(d, "chat")
    if change.get("workload_file") == "NOT_JSONL":
        bad = tmp_path / "NOT_JSONL"
        bad.write_text("model,prompt\nchat,hello\n")
        change = {**change, "workload_file": str(bad)}
    before = profile_file(d).read_bytes()
    with pytest.raises(ControlAPIError, match=message):
        await d.client.tune_start(TuneConfig(**{"model": "chat", **change}))
    await nothing_of_the_tune_left(d, {"chat"})
    assert profile_file(d).read_bytes() == before
    assert await d.client.tune_current() is None


async def test_a_model_that_fits_no_candidate_is_refused(d: RunningDaemon) -> None:
    d.write_profile("chat", model="org/chat", served_name="chat", device="cpu")
    d.daemon.ondemand.placer.host_free_bytes = lambda: 1024  # no room for a 1 GiB KV cache
    with pytest.raises(ControlAPIError, match="chat fits no candidate on this machine: "):
        await d.client.tune_start(TuneConfig(model="chat"))
    await nothing_of_the_tune_left(d, set())


async def test_gpu_only_candidates_on_simulated_gpus_with_energy_and_cost(
    daemon_factory: Any, fake_env: Path
) -> None:
    """Two SIMULATED GPUs (no GPU here) and the FAKE CUDA env: TP 2 and KV fp8 are offered,
    TP 2 really runs on both cards, and J/token gives a cost per 100 M tokens."""
    d: RunningDaemon = await daemon_factory(sim_settings())
    make_fake_vllm_env(d.paths.envs_dir, device="cuda")
    d.write_profile("chat", model="org/chat", served_name="chat", device="cuda",
                    env={"FAKE_ENGINE_ARGS": f"--token-delay {TOKEN_S}"})  # fmt: skip
    with pytest.raises(ControlAPIError, match=r"this machine has: .*kv-fp8, tp-2") as refused:
        await d.client.tune_start(TuneConfig(model="chat", only=("warp-drive",)))
    assert "worker-process" not in str(refused.value)  # a CPU-only candidate
    for i in (0, 1):
        feature(d).backend.set_load(sim_uuid(i), 0.5)  # type: ignore[attr-defined]
    config = TuneConfig(model="chat", concurrency=2, requests=6, only=("tp-2",), budget_s=900)
    seen_gpus: list[tuple[int, ...]] = []

    async def watch() -> None:
        while True:
            engine = d.daemon.supervisor.get("tune-chat")
            if engine is not None and engine.state == EngineState.READY:
                seen_gpus.append(engine.profile.gpus)
            await asyncio.sleep(0.1)  # sampling what the engine was placed on

    watcher = asyncio.create_task(watch())
    try:
        job = await tune_to_end(d, config)
    finally:
        watcher.cancel()
    assert job.state == TuneState.DONE, job.detail
    assert (0, 1) in seen_gpus  # TP 2 was placed on both cards
    assert job.simulated
    row = next(r for r in job.rows if r.key == "tp-2")
    assert {"power_mean_w", "joules_per_token", "vram_peak_gib", "temperature_peak_c"} <= set(
        row.figures
    )
    assert row.cost_per_100m is not None and row.cost_per_100m > 0
    assert job.currency == "EUR"
    await nothing_of_the_tune_left(d, set())


async def test_ctrl_c_in_traylm_tune_cancels_it_and_restores(d: RunningDaemon) -> None:
    await start_fake(d, "chat", args="--token-delay 0.05")
    with d.daemon.bus.subscribe(frozenset({"tune"})) as sub:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from engines.cli import main; main()",
            *("tune", "chat", "--only", "max-num-seqs-8", "--requests", "40", "--concurrency", "2"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            while True:  # the CLI follows the tune, which measures
                event = await asyncio.wait_for(sub.get(), 60)
                if isinstance(event, TuneProgress) and event.phase == "measure":
                    break
            proc.send_signal(signal.SIGINT)
            out, _ = await asyncio.wait_for(proc.communicate(), CANCEL_ANSWER_S)
        finally:  # never leave the CLI running into the next tests
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 130, out.decode()
    assert "stopping the tune and restoring what ran before" in out.decode()
    job = await d.client.tune_current()
    assert job is not None and job.state == TuneState.CANCELLED
    await nothing_of_the_tune_left(d, {"chat"})


async def test_cancel_is_a_verb_and_the_old_flag_an_alias(d: RunningDaemon) -> None:
    """`traylm tune cancel` and the old `traylm tune --cancel` both reach the daemon's cancel
    (not a tune of a profile named cancel)."""
    for args in (("tune", "cancel"), ("tune", "--cancel")):
        code, out = await traylm(*args)
        assert code == 1 and out.startswith("traylm: no tune is running"), out


async def test_the_cli_says_what_is_wrong_without_a_traceback(
    d: RunningDaemon, tmp_path: Path
) -> None:
    await start_fake(d, "chat")
    code, out = await traylm("tune", "chat", "--budget", "2s")
    assert code == 1 and out.startswith("traylm: a budget of 2 s cannot hold"), out
    bad = tmp_path / "day.jsonl"
    bad.write_text('{"url": "/v1/chat/completions", "body": {}}\nnot json\n')
    code, out = await traylm("tune", "chat", "--workload", str(bad))
    assert code == 1 and "day.jsonl:2: not JSON" in out and "Traceback" not in out, out
    code, out = await traylm("tune", "--undo", "chat")
    assert code == 1 and "nothing to undo for profile 'chat'" in out
    await nothing_of_the_tune_left(d, {"chat"})


async def test_the_users_recorded_traffic_is_the_workload(d: RunningDaemon, tmp_path: Path) -> None:
    """A `traylm requests export` file: replayed as fast as possible for throughput, to every
    candidate, through the gateway (its `model` replaced by the tuned one's)."""
    await start_fake(d, "chat", args=f"--token-delay {TOKEN_S}")
    day = tmp_path / "day.jsonl"
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "yesterday", "max_tokens": 16,
                       "messages": [{"role": "user", "content": f"q{i}"}]},
              "traylm": {"arrived_at_s": 1000.0 + i * 30}} for i in range(6)]  # fmt: skip
    day.write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = TuneConfig(model="chat", workload="file", workload_file=str(day), concurrency=4,
                        only=("max-num-seqs-2",))  # fmt: skip
    job = await tune_to_end(d, config)
    assert job.state == TuneState.DONE, job.detail
    assert [r.key for r in job.rows] == ["default", "max-num-seqs-2"]
    run = await d.client.bench_run(job.measures[0].bench_run_id or 0)
    assert run.config.workload == "file" and run.config.as_fast_as_possible
    assert run.levels[0].completed == 6 and run.levels[0].duration_s < 30  # not at its pace
    await nothing_of_the_tune_left(d, {"chat"})


async def test_traylm_tune_works_with_api_keys_on_and_the_credential_is_never_kept(
    daemon_factory: Any, fake_env: Path
) -> None:
    """With a key (keys for every client), the tuner measures with the daemon's own credential
    (random, in memory): its requests pass the gateway, are recorded as the tuner's, and the
    credential is in neither requests.db, its WAL nor any log."""
    d: RunningDaemon = await daemon_factory(
        fast_settings(free_loopback_port(), api_key_sha256=(hash_key("sekret"),))
    )
    await start_fake(d, "chat", args=f"--token-delay {TOKEN_S}")
    code, out = await traylm(
        "tune", "chat", "--only", "max-num-seqs-1", "--requests", "6", "--concurrency", "2",
        timeout_s=300,
    )  # fmt: skip
    assert code == 0, out
    assert "needs an API key" not in out
    job = await d.client.tune_current()
    assert job is not None and job.state == TuneState.DONE, job.detail
    for _ in range(300):  # the recorder writes in batches
        rows = await d.client.requests_list(client="tuner")
        if len(rows) >= 12:  # 2 candidates x 2 runs x 6 requests, less any warm-up
            break
        await asyncio.sleep(0.1)
    assert rows and all(r["client"] == "tuner" and not r["key"] for r in rows)
    secret = d.daemon.ctx.internal_key.encode()
    assert secret and b"sekret" not in secret
    kept = [p for p in d.paths.data_dir.glob("requests.db*")] + [
        p for p in d.paths.logs_dir.rglob("*") if p.is_file()
    ]
    assert any(p.name == "requests.db" for p in kept)
    assert [p for p in kept if secret in p.read_bytes()] == []
    await nothing_of_the_tune_left(d, {"chat"})
