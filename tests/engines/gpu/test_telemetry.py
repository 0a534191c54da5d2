"""Replay of recorded traces, energy per token from a synthetic trace, the sampler thread's
bookkeeping, history downsampling into SQLite, and the thermal guard's escalation logic."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path

import pytest

from engines.core.store import Store
from engines.errors import ConfigError, GPUPermissionDenied, GPUUnavailable
from engines.events import (
    EngineEnergy,
    Event,
    GPUInfo,
    GPUProcess,
    GPUSampled,
    GPUSnapshot,
    GPUState,
    GPUStateChanged,
    GuardLevel,
)
from engines.gpu.energy import (
    EnergyPoint,
    EnergyWindow,
    cost_per_million_tokens,
    energy_now_mj,
    energy_per_token,
    parse_generation_tokens,
    psu_status,
)
from engines.gpu.guard import GuardThresholds, ThermalGuard
from engines.gpu.history import TelemetryHistory, build_history
from engines.gpu.replay import ReplayBackend, read_trace, record
from engines.gpu.sampler import Sampler
from engines.gpu.sim import DESKTOP, ManualClock, SimulatedBackend, sim_uuid

GPU0, GPU1 = sim_uuid(0), sim_uuid(1)


# --------------------------------------------------------------------------- record and replay


def test_replay_of_a_recorded_trace_gives_the_same_snapshots(tmp_path: Path) -> None:
    clock = ManualClock(start_s=1_700_000_000.0)
    sim = SimulatedBackend(2, clock=clock, wall=clock)
    sim.set_load(GPU0, 0.8)
    sim.set_processes(GPU0, [GPUProcess(pid=321, used_memory_bytes=5 << 30)])
    seen: list[tuple[GPUSnapshot, ...]] = []
    path = tmp_path / "trace.jsonl"
    count = record(
        sim,
        path,
        seconds=20,
        interval_s=1.0,
        slow_every=5,
        sleep=clock.advance,
        on_sample=lambda snaps, _: seen.append(snaps),
    )
    assert count == 20 and len(seen) == 20
    replay = ReplayBackend(path, retime=False, loop=False)
    assert replay.open() == sim.infos()
    replayed = [replay.sample() for _ in range(20)]
    assert replayed == seen  # field for field, processes and fans included
    assert replay.sample() == seen[-1]  # the end of a trace repeats its last sample
    assert seen[0][0].processes is not None and seen[1][0].processes is None


def test_demo_replay_is_labelled_simulated_and_read_only(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record(SimulatedBackend(1), path, seconds=2, interval_s=1, sleep=lambda s: None)
    trace = read_trace(path)
    # a trace recorded from real GPUs says simulated=false; the demo replay marks it anyway
    real = [dataclasses.asdict(dataclasses.replace(s, simulated=False)) for s in trace.samples[0]]
    infos = [dataclasses.asdict(dataclasses.replace(i, simulated=False)) for i in trace.infos]
    header = {"kind": "header", "version": 1, "backend": "nvml", "simulated": False, "gpus": infos}
    sample = {"kind": "sample", "ts_s": 1.0, "gpus": real}
    path.write_text(json.dumps(header) + "\n" + json.dumps(sample) + "\n")
    assert not any(s.simulated for s in ReplayBackend(path, retime=False).sample())
    replay = ReplayBackend(path, retime=True)
    assert all(i.simulated for i in replay.open())
    assert all(s.simulated for s in replay.sample())
    with pytest.raises(GPUPermissionDenied, match="replayed trace"):
        replay.set_power_limit(GPU0, 300_000)


def test_bad_trace_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kind": "header", "version": 1, "gpus": []}\n{"kind": "sample", "gpus": 3}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2 is not a GPU trace line"):
        read_trace(path)
    path.write_text('{"kind": "sample", "ts_s": 1, "gpus": []}\n')
    with pytest.raises(ConfigError, match="no version-1 header"):
        read_trace(path)


# --------------------------------------------------------------------------- energy


def synthetic_trace(path: Path) -> list[tuple[float, int]]:
    """Two GPUs at a steady 300 W and 250 W for 20 s (1 Hz), written as a real trace file;
    returns the engine's (time, generated tokens) at each sample: 110 tokens/s."""
    infos = SimulatedBackend(2).infos()
    with path.open("w") as fh:
        fh.write(
            json.dumps(
                {
                    "kind": "header",
                    "version": 1,
                    "backend": "nvml",
                    "simulated": False,
                    "gpus": [dataclasses.asdict(i) for i in infos],
                }
            )
            + "\n"
        )
        for n in range(21):
            ts = 1000.0 + n
            gpus = [
                GPUSnapshot(
                    uuid=GPU0,
                    index=0,
                    ts_s=ts,
                    energy_mj=5_000_000 + 300_000 * n,
                    power_draw_mw=300_000,
                ),
                GPUSnapshot(
                    uuid=GPU1,
                    index=1,
                    ts_s=ts,
                    energy_mj=9_000_000 + 250_000 * n,
                    power_draw_mw=250_000,
                ),
            ]
            fh.write(
                json.dumps(
                    {"kind": "sample", "ts_s": ts, "gpus": [dataclasses.asdict(g) for g in gpus]}
                )
                + "\n"
            )
    return [(1000.0 + n, 40 + 110 * n) for n in range(21)]


def test_joules_per_token_from_a_synthetic_trace(tmp_path: Path) -> None:
    tokens = synthetic_trace(tmp_path / "trace.jsonl")
    replay = ReplayBackend(tmp_path / "trace.jsonl", retime=False, loop=False)
    window = EnergyWindow(10.0)
    results: list[EngineEnergy] = []
    for ts, generated in tokens:
        snaps = replay.sample()
        energy = energy_now_mj(snaps, (GPU0, GPU1), ts)
        assert energy is not None
        window.add(EnergyPoint(ts, energy, generated))
        span = window.span()
        if span is not None:
            results.append(
                energy_per_token(
                    "e",
                    *span,
                    gpus=(GPU0, GPU1),
                    price_per_kwh=0.30,
                    currency="EUR",
                    simulated=False,
                )
            )
    assert len(results) == 11  # from t = 10 s on, every sample closes a 10 s window
    last = results[-1]
    assert last.window_s == 10.0 and last.tokens == 1100
    assert last.energy_j == pytest.approx(5500.0)  # (300 + 250) W × 10 s
    assert last.joules_per_token == pytest.approx(5.0)
    assert last.power_w == pytest.approx(550.0)
    # 5 J/token × 1e6 tokens = 5 MJ = 1.389 kWh → 0.4167 EUR at 0.30 EUR/kWh
    assert last.cost_per_mtok == pytest.approx(5.0 * 1e6 / 3.6e6 * 0.30)
    assert cost_per_million_tokens(3.6, 1.0) == pytest.approx(1.0)


def test_energy_window_rules() -> None:
    w = EnergyWindow(2.0)
    assert w.window_s == 5.0  # never shorter than 5 s
    for t in range(4):
        w.add(EnergyPoint(float(t), 1000.0 * t, 10.0 * t))
    assert w.span() is None  # 3 s of data: too short
    w.add(EnergyPoint(6.0, 6000.0, 60.0))
    assert w.span() is not None
    w.add(EnergyPoint(7.0, 10.0, 70.0))  # the energy counter went back: driver reloaded
    assert w.span() is None
    idle = energy_per_token(
        "e",
        EnergyPoint(0, 0, 50),
        EnergyPoint(10, 2e5, 50),
        gpus=(),
        price_per_kwh=0.3,
        currency="EUR",
        simulated=True,
    )
    assert idle.joules_per_token is None and idle.cost_per_mtok is None and idle.power_w == 20.0


def test_token_counter_parsing() -> None:
    text = (
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{model_name="a"} 1234.0\n'
        'vllm:generation_tokens_total{model_name="b",engine="1"} 6.0\n'
        "vllm:prompt_tokens_total 99\n"
    )
    assert parse_generation_tokens(text) == 1240.0
    assert parse_generation_tokens("fake:requests_total 3\n") is None


def test_energy_is_carried_to_the_scrape_time() -> None:
    snap = GPUSnapshot(uuid=GPU0, index=0, ts_s=100.0, energy_mj=1_000, power_draw_mw=200_000)
    assert energy_now_mj([snap], [GPU0], 100.5) == 1_000 + 100_000
    assert energy_now_mj([snap], [GPU0, GPU1], 100.5) is None  # a GPU is missing


def test_psu_headroom() -> None:
    def snaps(watts: float, limit: float) -> list[GPUSnapshot]:
        return [
            GPUSnapshot(
                uuid=u,
                index=i,
                ts_s=0,
                power_draw_mw=int(watts * 1000),
                power_limit_mw=int(limit * 1000),
            )
            for i, u in enumerate((GPU0, GPU1))
        ]

    calm = psu_status(snaps(300, 350), psu_watts=1600, other_watts=250, warn_fraction=0.85)
    assert calm.warning == "" and calm.gpu_power_w == 600 and calm.limits_w == 700
    hot = psu_status(snaps(600, 600), psu_watts=1600, other_watts=250, warn_fraction=0.85)
    assert "91% of the 1600 W power supply" in hot.warning
    risky = psu_status(snaps(300, 700), psu_watts=1600, other_watts=250, warn_fraction=0.85)
    assert "at their power limits the GPUs may draw 1400 W" in risky.warning


# --------------------------------------------------------------------------- sampler


def test_sampler_publishes_carries_processes_and_labels_engines(tmp_path: Path) -> None:
    clock = ManualClock()
    sim = SimulatedBackend(2, clock=clock, wall=clock)
    sim.set_processes(GPU0, [GPUProcess(pid=4242, used_memory_bytes=1 << 30)])
    events: list[Event] = []
    sampler = Sampler(
        sim,
        interval_s=1.0,
        process_interval_s=3600,
        publish=events.append,
        engine_pids=lambda: {4242: "qwen"},
    )
    first = sampler.sample_once()
    clock.advance(1)
    second = sampler.sample_once()
    assert first[0].processes == (  # the engine labelled; the desktop on GPU 0 is not ours
        GPUProcess(pid=4242, used_memory_bytes=1 << 30, engine_id="qwen"),
        *(GPUProcess(pid=pid, used_memory_bytes=held, name=name) for pid, name, held in DESKTOP),
    )
    assert second[0].processes == first[0].processes  # carried between slow reads
    kinds = [e.kind for e in events]
    assert kinds == ["gpu.state", "gpu.sample", "gpu.sample"]
    sample = events[1]
    assert isinstance(sample, GPUSampled) and sample.simulated and len(sample.gpus) == 2
    assert sampler.ring[-1] == second and sampler.samples == 2


def test_sampler_reports_unavailable_lost_and_recovers() -> None:
    sim = SimulatedBackend(2)
    sim.unavailable = True
    events: list[Event] = []
    sampler = Sampler(sim, interval_s=0.05, process_interval_s=5, publish=events.append)
    sampler.start()
    try:
        _wait(
            lambda: any(
                isinstance(e, GPUStateChanged) and e.state == GPUState.UNAVAILABLE for e in events
            )
        )
        assert sampler.state == GPUState.UNAVAILABLE and "retrying in 2 s" in sampler.message
    finally:
        sampler.stop()  # ends the backoff wait at once
    sim.unavailable = False
    sampler.sample_once()  # the next try (after the backoff) finds the GPUs again
    assert sampler.state == GPUState.OK
    assert isinstance(events[-2], GPUStateChanged) and events[-2].state == GPUState.OK
    sim.inject(GPU1, lost=True)
    sampler.sample_once()
    sampler.sample_once()
    lost = [e for e in events if isinstance(e, GPUStateChanged) and e.state == GPUState.LOST]
    assert len(lost) == 1 and lost[0].uuid == GPU1 and "reboot" in lost[0].message


def test_a_sample_asked_for_comes_now_with_the_process_list() -> None:
    """Placement after an engine's stop asks for a sample read after the stop: it comes at
    once (not at the next of these minute-long turns) and reads the process list afresh."""
    sim = SimulatedBackend(1)
    sampler = Sampler(sim, interval_s=60, process_interval_s=3600, publish=lambda e: None)
    sampler.start()
    try:
        _wait(lambda: sampler.samples == 1)
        sim.set_processes(GPU0, [GPUProcess(pid=4242, used_memory_bytes=1 << 30)])
        stopped_s = time.monotonic()
        assert sampler.sample_after(stopped_s, timeout_s=30)
        assert sampler.sampled_at_s > stopped_s and sampler.samples == 2
        listed = [p.pid for p in sampler.latest[0].processes or ()]
        assert listed == [4242, *(pid for pid, _, _ in DESKTOP)]
        assert sampler.sample_after(stopped_s, timeout_s=0)  # fresh already: no new sample
        assert sampler.samples == 2
    finally:
        sampler.stop()  # ends the minute's wait at once
    assert not sampler.sample_after(time.monotonic(), timeout_s=0.05)  # none comes now


class SampleFailsBackend(SimulatedBackend):
    """FAKE driver that lists its GPUs but answers no sample while ``failing`` (a driver half
    loaded): each retry opened it, logged "back", then the outage again."""

    failing = True

    def sample(self, *, slow: bool = False) -> tuple[GPUSnapshot, ...]:
        if self.failing:
            raise GPUUnavailable("no NVIDIA GPU found: the FAKE driver answers no sample")
        return super().sample(slow=slow)


@pytest.mark.parametrize("backend", ["switched off", "opens but cannot sample"])
def test_an_outage_is_logged_once_and_its_end_once(
    backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A computer without NVIDIA retries forever; the log says so once, each
    retry only at debug, and says when telemetry comes back."""
    monkeypatch.setattr("engines.gpu.sampler.BACKOFF_MIN_S", 0.01)
    monkeypatch.setattr("engines.gpu.sampler.BACKOFF_MAX_S", 0.02)
    sim = SampleFailsBackend(2)
    sim.failing = backend == "opens but cannot sample"
    sim.unavailable = not sim.failing
    events: list[Event] = []
    caplog.set_level(logging.DEBUG, logger="engines.gpu.sampler")
    sampler = Sampler(sim, interval_s=0.05, process_interval_s=5, publish=events.append)
    sampler.start()
    try:
        _wait(lambda: sum("still unavailable" in r.message for r in caplog.records) >= 5)
        sim.unavailable = sim.failing = False
        _wait(lambda: sampler.state == GPUState.OK)
    finally:
        sampler.stop()
    by_level = [(r.levelno, r.message.split(":")[0]) for r in caplog.records]
    assert by_level.count((logging.WARNING, "GPU telemetry unavailable")) == 1
    assert by_level.count((logging.INFO, "GPU telemetry is back")) == 1
    states = [e.state for e in events if isinstance(e, GPUStateChanged)]
    assert states == [GPUState.UNAVAILABLE, GPUState.OK]


def _wait(check, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    done = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        done.wait(0.02)
    raise AssertionError("condition not reached")


def test_history_downsamples_into_sqlite_and_builds_columns(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.db")
    store.open()
    clock = ManualClock(start_s=time.time() // 10 * 10)
    sim = SimulatedBackend(2, clock=clock, wall=clock)
    sim.set_load(GPU0, 1.0)
    history = TelemetryHistory(store, resolution_s=10, keep_days=7)
    ring = []
    for _ in range(35):
        clock.advance(1)
        snaps = sim.sample()
        ring.append(snaps)
        history.add(snaps)
    rows = store.query("SELECT ts_s, gpu_uuid, data_json FROM telemetry ORDER BY ts_s")
    assert len(rows) == 6  # three completed 10 s buckets × two GPUs
    row = json.loads([r for r in rows if r["gpu_uuid"] == GPU0][-1]["data_json"])
    assert row["samples"] == 10 and row["power_draw_w"] > 300 and row["temperature_max_c"]
    built = build_history(
        uuids=[(GPU0, 0), (GPU1, 1)],
        ring=[],
        rows=store.query("SELECT * FROM telemetry"),
        resolution_s=10,
        points=100,
        since_s=0,
        simulated=True,
    )
    assert len(built[0].ts_s) == 3 and built[0].simulated
    short = build_history(
        uuids=[(GPU0, 0)], ring=ring, rows=[], resolution_s=1, points=7, since_s=0, simulated=True
    )
    assert len(short[0].ts_s) <= 7 and short[0].power_draw_w[-1] is not None
    store.close()


# --------------------------------------------------------------------------- guard logic


def test_guard_escalates_one_step_at_a_time_then_stands_down() -> None:
    guard = ThermalGuard(GuardThresholds(step_s=10))
    info = {GPU0: GPUInfo(uuid=GPU0, index=0, name="x", slowdown_temperature_c=90)}

    def at(temp: int, now: float) -> list[str]:
        snap = GPUSnapshot(uuid=GPU0, index=0, ts_s=now, temperature_c=temp)
        return [s.action for s in guard.evaluate([snap], info, now)]

    assert at(79, 0) == []
    assert at(80, 1) == ["notice"]  # 10 °C below slowdown: at once
    assert at(95, 2) == []  # far past every threshold, but the next step waits step_s
    assert at(95, 11) == ["lower_power"]
    assert at(95, 15) == []
    assert at(95, 21) == ["pause"]
    assert at(95, 31) == ["stop_engine"]
    assert at(95, 99) == []
    assert guard.level(GPU0) == GuardLevel.STOP
    assert at(78, 100) == []  # below notice but inside the hysteresis
    assert at(76, 101) == ["stand_down"]
    assert guard.level(GPU0) == GuardLevel.NORMAL


def test_guard_threshold_order_is_checked() -> None:
    assert GuardThresholds().problems() == []
    bad = GuardThresholds(pause_margin_c=8.0)
    assert any(
        "guard_pause_margin_c = 8 must not exceed guard_power_margin_c" in p for p in bad.problems()
    )


def test_missing_temperature_does_not_trigger_the_guard() -> None:
    guard = ThermalGuard(GuardThresholds())
    snap = GPUSnapshot(uuid=GPU0, index=0, ts_s=0, temperature_c=None)
    assert guard.evaluate([snap], {}, 0) == []
