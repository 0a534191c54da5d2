"""What the tray app shows of a model served by two replicas (AppState): its name once among
the served models, each engine's "replica k/2 on GPU n" (the dashboard's engines table), and the
replicas of one engine in order."""

from __future__ import annotations

from desktop.daemon.state import AppState
from engines.events import EngineState, EngineStatus


def status(engine_id: str, gpus: tuple[int, ...]) -> EngineStatus:
    return EngineStatus(
        engine_id, "vllm", EngineState.READY, ("twin",), 8001, 1, 0, "", None, None, None,
        "twin", "cuda", "0.32.0", gpus=gpus,
    )  # fmt: skip


def test_two_replicas_show_as_one_model_and_each_engine_says_which() -> None:
    state = AppState()
    state.engines = {e.engine_id: e for e in (status("twin.r2", (1,)), status("twin", (0,)))}
    assert state.served_models() == ["twin"]
    assert [e.engine_id for e in state.replicas_of(state.engines["twin.r2"])] == [
        "twin",
        "twin.r2",
    ]
    assert state.replica_text(state.engines["twin"]) == "replica 1/2 on GPU 0"
    assert state.replica_text(state.engines["twin.r2"]) == "replica 2/2 on GPU 1"
    state.engines = {"twin": status("twin", (0,))}
    assert state.replica_text(state.engines["twin"]) == ""
