"""Benchmark runs in the ``bench_runs`` table of the daemon's SQLite file.

A row is inserted when a run starts (state running) and completed when it ends;
``config_json`` holds the BenchConfig, ``result_json`` everything else of the BenchRun. Every call
blocks: the daemon calls these through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from engines.core.store import Store, dumps
from engines.errors import BenchError
from engines.events.bench import BenchConfig, BenchLevel, BenchRun, BenchRunSummary, BenchState
from engines.events.codec import from_plain, to_plain


class RunStore:
    def __init__(self, store: Store) -> None:
        self._store = store

    def create(self, config: BenchConfig, *, target: str, engine: Mapping[str, str]) -> BenchRun:
        now = time.time()
        result = {"state": str(BenchState.RUNNING), "target": target, "engine": dict(engine)}
        with self._store.transaction() as db:
            cur = db.execute(
                "INSERT INTO bench_runs (created_s, name, config_json, result_json) "
                "VALUES (?,?,?,?)",
                (now, config.name, dumps(to_plain(config)), dumps(result)),
            )
            run_id = int(cur.lastrowid or 0)
        return BenchRun(
            id=run_id,
            name=config.name,
            created_s=now,
            state=BenchState.RUNNING,
            config=config,
            target=target,
            engine=dict(engine),
        )

    def save(self, run: BenchRun) -> None:
        data = to_plain(run)
        for key in ("id", "name", "created_s", "config"):
            data.pop(key)
        with self._store.transaction() as db:
            db.execute("UPDATE bench_runs SET result_json = ? WHERE id = ?", (dumps(data), run.id))

    def get(self, run_id: int) -> BenchRun:
        rows = self._store.query("SELECT * FROM bench_runs WHERE id = ?", (run_id,))
        if not rows:
            raise BenchError(f"no benchmark run {run_id}; `traylm bench ls` lists them")
        return _run(rows[0])

    def list(self, limit: int = 200) -> list[BenchRunSummary]:
        rows = self._store.query("SELECT * FROM bench_runs ORDER BY id DESC LIMIT ?", (limit,))
        return [summary(_run(r)) for r in rows]

    def delete(self, run_id: int) -> None:
        self.get(run_id)
        with self._store.transaction() as db:
            db.execute("DELETE FROM bench_runs WHERE id = ?", (run_id,))

    def mark_interrupted(self) -> int:
        """Runs left "running" by a daemon that stopped mid-run; returns how many."""
        count = 0
        rows = self._store.query(
            "SELECT * FROM bench_runs WHERE result_json LIKE ?", ('%"state":"running"%',)
        )
        for row in rows:
            run = _run(row)
            if run.state == BenchState.RUNNING:
                self.save(_interrupted(run))
                count += 1
        return count


def _interrupted(run: BenchRun) -> BenchRun:
    from dataclasses import replace

    return replace(
        run,
        state=BenchState.INTERRUPTED,
        finished_s=run.finished_s or time.time(),
        detail="the daemon stopped during the run",
    )


def _run(row: Mapping[str, Any]) -> BenchRun:
    result = json.loads(row["result_json"])
    data = {
        **result,
        "id": row["id"],
        "name": row["name"],
        "created_s": row["created_s"],
        "config": json.loads(row["config_json"]),
    }
    return from_plain(BenchRun, data)


def best_level(run: BenchRun) -> BenchLevel | None:
    done = [lv for lv in run.levels if lv.completed]
    return max(done, key=lambda lv: lv.output_throughput_tps) if done else None


def summary(run: BenchRun) -> BenchRunSummary:
    best = best_level(run)
    engine = run.engine
    engine_text = (
        f"{engine.get('engine', '')} {engine.get('version', '')} ({engine.get('device', '')})"
        if engine.get("engine")
        else ""
    )
    return BenchRunSummary(
        id=run.id,
        name=run.name,
        created_s=run.created_s,
        state=run.state,
        model=run.config.model,
        workload=run.config.workload,
        input_len=run.config.input_len,
        output_len=run.config.output_len,
        concurrency=run.config.concurrency,
        target=run.target,
        engine=engine_text,
        finished_s=run.finished_s,
        best_output_throughput_tps=best.output_throughput_tps if best else None,
        best_concurrency=best.concurrency if best else None,
        joules_per_token=best.telemetry.joules_per_token if best else None,
        simulated=any(lv.telemetry.simulated for lv in run.levels),
        made_by=run.config.made_by,
        detail=run.detail,
    )
