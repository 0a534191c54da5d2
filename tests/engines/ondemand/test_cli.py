"""`traylm ps`, `load`, `unload`, `attach`, `detach` as a user runs them (real subprocesses:
the daemon with two simulated GPUs and the FAKE vLLM env)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.runtime.adapters.vllm_start import PHASES
from tests.engines.cli.test_cli import serve, stop_daemon, traylm
from tests.fakes.fake_vllm_env import make_fake_vllm_env


@pytest.fixture
def sim_served(env: dict[str, str]) -> Iterator[int]:
    port = free_loopback_port()
    make_fake_vllm_env(Path(env["TRAYLM_ENVS_DIR"]), device="cuda")
    proc = serve(env, "--port", str(port), "--simulate-gpus", "2")
    yield port
    stop_daemon(proc)


def write(env: dict[str, str], name: str, **fields: object) -> None:
    profiles = Path(env["TRAYLM_HOME"]) / "config" / "profiles"
    write_toml_atomic(
        profiles / f"{name}.toml", {"model": f"org/{name}", "device": "cpu", **fields}
    )


@pytest.mark.slow
def test_load_ps_unload(env: dict[str, str], sim_served: int) -> None:
    write(env, "m", served_name="m", gpus="auto", device="cuda")
    out = traylm(env, "load", "m", "--gpus", "1", "--ttl", "10m", "--timeout", "30")
    assert out.returncode == 0, out.stderr
    assert "m: starting on GPU 1" in out.stdout and "m: ready" in out.stdout
    ps = traylm(env, "ps").stdout
    assert "NAME" in ps and "MEMORY" in ps
    [line] = [row for row in ps.splitlines() if row.startswith("m ")]
    assert "ready" in line and " 1 " in line and "21.77 GiB" in line and "in 10m" in line
    assert "(load)" in line
    listed = traylm(env, "ps", "--all").stdout
    assert any(r.startswith("m ") and "loaded" in r for r in listed.splitlines())
    assert any("llama-3.1-8b" in r and "unloaded" in r for r in listed.splitlines())
    out = traylm(env, "unload", "m")
    assert out.returncode == 0 and "m unloaded" in out.stdout
    assert "no model is loaded" in traylm(env, "ps").stdout


@pytest.mark.slow
def test_load_prints_the_start_phases(env: dict[str, str], sim_served: int) -> None:
    write_toml_atomic(
        Path(env["TRAYLM_HOME"]) / "config" / "profiles" / "slow.toml",
        {"model": "org/slow", "device": "cpu", "env": {"FAKE_ENGINE_ARGS": "--startup-delay 4"}},
    )
    out = traylm(env, "load", "slow", "--timeout", "60")
    assert out.returncode == 0, out.stderr
    said = [line.strip() for line in out.stdout.splitlines() if line.startswith("  starting: ")]
    labels = [r.label for r in PHASES]
    shown = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in said]
    assert not any(s.startswith("on GPU") for s in shown), shown  # a CPU model holds none
    engine_phases = [s for s in shown if s != "launching"]  # the launch, then its phases
    assert len(engine_phases) >= 2 and all(s in labels for s in engine_phases), shown
    assert out.stdout.rstrip().endswith("slow: ready")


@pytest.mark.slow
def test_ps_shows_the_start_phase_of_a_loading_model(env: dict[str, str], sim_served: int) -> None:
    write_toml_atomic(
        Path(env["TRAYLM_HOME"]) / "config" / "profiles" / "slow.toml",
        {"model": "org/slow", "device": "cpu", "env": {"FAKE_ENGINE_ARGS": "--startup-delay 8"}},
    )
    assert traylm(env, "load", "slow", "--no-wait").returncode == 0
    labels = [r.label for r in PHASES]

    def starting_line() -> str:
        ps = traylm(env, "ps").stdout
        return next((r for r in ps.splitlines() if r.startswith("slow ") and "starting" in r), "")

    shown = ""
    while not shown:  # the load ends in a few seconds; each ps is a new process
        line = starting_line()
        assert line or "ready" not in traylm(env, "ps").stdout, "never seen starting with a phase"
        shown = next((label for label in labels if line.endswith(f"  {label}")), "")
    assert shown in labels


@pytest.mark.slow
def test_bad_input_gets_clear_errors(env: dict[str, str], sim_served: int) -> None:
    write(env, "m", served_name="m")
    for args, expected in (
        (("load", "m", "--ttl", "-5"), "ttl '-5' is negative"),
        (("load", "m", "--gpus", "7"), "GPU 7 does not exist; the GPUs here are 0, 1"),
        (("load", "m", "--gpus", "x"), "--gpus 'x': give GPU indices"),
        (("unload", "m"), "m is not loaded"),
        (("load", "nope"), "the model 'nope' is not served"),
        (("attach", "x", "http://127.0.0.1:1/v1"), "does not answer"),
        (("detach", "x"), "no attached server named 'x'"),
    ):
        out = traylm(env, *args)
        assert out.returncode == 1, (args, out.stdout)
        assert expected in out.stderr, (args, out.stderr)


@pytest.mark.slow
def test_attach_and_detach(env: dict[str, str], sim_served: int) -> None:
    write(env, "host", served_name="host")
    assert traylm(env, "load", "host", "--timeout", "30").returncode == 0
    port = next(
        int(r.split("127.0.0.1:")[1].split()[0])
        for r in traylm(env, "status").stdout.splitlines()
        if "127.0.0.1:" in r and "host" in r
    )
    out = traylm(env, "attach", "other", f"http://127.0.0.1:{port}/v1")
    assert out.returncode == 0, out.stderr
    assert "attached other → http://127.0.0.1:" in out.stdout and "serves host" in out.stdout
    ps = traylm(env, "ps").stdout
    assert any(r.startswith("other ") and "attached http://" in r for r in ps.splitlines())
    out = traylm(env, "detach", "other")
    assert out.returncode == 0 and "keeps running" in out.stdout
