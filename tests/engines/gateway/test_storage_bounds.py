"""The database's growth is bounded: the usage log keeps served names only (a huge `model` in a
refused request is stored as "(unknown)"), and the usage log and telemetry history are pruned
by age and by row count."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import time

import aiohttp

from engines.config.sections import GPUSettings, Settings
from engines.core.procs import free_loopback_port
from engines.core.store import Store
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import start_fake

HUGE_MODEL = "m" * (2 * 1024 * 1024)


def db_bytes(d: RunningDaemon) -> int:
    return sum(p.stat().st_size for p in d.paths.data_dir.glob(d.paths.db_path.name + "*"))


async def usage_rows(d: RunningDaemon) -> list[dict[str, object]]:
    await d.daemon.usage.flush()
    return await asyncio.to_thread(
        d.daemon.store.query, "SELECT model, status, length(model) AS n FROM usage ORDER BY id"
    )


async def test_a_huge_model_name_is_not_stored(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    await daemon.daemon.usage.flush()
    before = db_bytes(daemon)
    async with aiohttp.ClientSession() as http:
        huge = json.dumps({"model": HUGE_MODEL, "messages": [], "max_tokens": 1}).encode()
        for _ in range(10):
            async with http.post(daemon.url + "/v1/chat/completions", data=io.BytesIO(huge)) as r:
                assert r.status == 404
        daemon.daemon.ctx.pause_requests("test")
        async with http.post(daemon.url + "/v1/completions", data=io.BytesIO(huge)) as r:
            assert r.status == 503
        daemon.daemon.ctx.resume_requests()
        body = {"model": "fake", "messages": [], "max_tokens": 1}
        async with http.post(daemon.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
    rows = await usage_rows(daemon)
    assert [r["model"] for r in rows] == ["(unknown)"] * 11 + ["fake"]
    assert db_bytes(daemon) - before < 256 * 1024  # 12 small rows, not 22 MiB of names


def old_rows(store: Store, now: float) -> None:
    """An install that ran a long time: old and too many usage and telemetry rows."""
    store.open()
    with store.transaction() as db:
        db.executemany(
            "INSERT INTO usage (ts_s, model, engine_id, route, status) VALUES (?,?,?,?,?)",
            [(now - 200 * 86400 + i, "m", "e", "/v1/completions", 200) for i in range(50)]
            + [(now - 3600 + i, "m", "e", "/v1/completions", 200) for i in range(300)],
        )
        db.executemany(
            "INSERT INTO telemetry (ts_s, gpu_uuid, data_json) VALUES (?,?,?)",
            [(now - 30 * 86400 + i, "GPU-old", "{}") for i in range(50)]
            + [(now - 3600 + i * 10, "GPU-kept", "{}") for i in range(300)],
        )
    store.close()


async def test_usage_and_telemetry_are_pruned_by_age_and_rows(
    daemon_factory: DaemonFactory, paths, fake_env
) -> None:
    now = time.time()
    old_rows(Store(paths.db_path), now)
    base = fast_settings(free_loopback_port(), usage_days=30.0, usage_max_rows=100)
    settings: Settings = dataclasses.replace(
        base, gpu=GPUSettings(simulate_gpus=1, history_days=7.0, history_max_rows=120)
    )
    d = await daemon_factory(settings)
    store = d.daemon.store

    async def counts() -> tuple[int, int, int, float, float]:
        usage = await asyncio.to_thread(
            store.query, "SELECT COUNT(*) AS n, MIN(ts_s) AS t FROM usage"
        )
        telemetry = await asyncio.to_thread(
            store.query,
            "SELECT SUM(gpu_uuid = 'GPU-old') AS old, SUM(gpu_uuid = 'GPU-kept') AS kept, "
            "MIN(CASE WHEN gpu_uuid = 'GPU-kept' THEN ts_s END) AS t FROM telemetry",
        )
        u, t = usage[0], telemetry[0]
        return u["n"], t["old"] or 0, t["kept"] or 0, u["t"] or now, t["t"] or now

    # the simulated GPU adds rows of its own after the first prune: count the test's rows
    deadline = time.monotonic() + 30
    while (found := await counts())[:3] != (100, 0, 120):
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)
    usage_oldest, telemetry_oldest = found[3:]
    assert usage_oldest >= now - 3600 + 200  # the newest 100 of the recent rows
    assert telemetry_oldest >= now - 3600 + 180 * 10  # the newest 120 rows
    status = await d.client.status()
    assert json.dumps(status)  # the daemon serves on
