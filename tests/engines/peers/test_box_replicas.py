"""Replicas across boxes: two `traylm serve` daemons in network namespaces
the test creates (boxes.py), paired; the FAKE engine serves "chat" on box B's simulated GPU
(and on A's for the spread), and A's gateway has B's as one more replica of "chat", reached
over the veth pair by mutual TLS only. Clients are the openai SDK in A's namespace."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import PidRegistry, reap_orphans
from tests.engines.peers.boxes import PEER_PORT, Box, boxes
from tests.fakes.fake_vllm_env import make_fake_vllm_env

__all__ = ["boxes"]  # the fixture
pytestmark = pytest.mark.slow  # two daemons, engines, a dozen `traylm` runs per test
MODEL = "chat"
ON_B = f"{MODEL}@box-b"


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in time"
        time.sleep(0.2)


def _ps(box: Box, *args: str) -> list[dict[str, object]]:
    out = box.traylm("ps", "--json", *args)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


def _sees_b(a: Box) -> bool:
    return any(r["engine_id"] == ON_B and r["state"] == "ready" for r in _ps(a))


def _load(box: Box) -> None:
    out = box.traylm("load", MODEL, "--timeout", "120", timeout_s=150)
    assert out.returncode == 0, out.stdout + out.stderr


def _chats(box: Box, count: int) -> list[dict[str, object]]:
    out = box.python("-m", "tests.engines.peers.box_chat", "many", MODEL, str(count))
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture
def streams() -> Iterator[Callable[[Box, int, str], subprocess.Popen[str]]]:
    """Start a streamed chat in a box's namespace (``text``: its conversation); any still
    running at the end is killed."""
    started: list[subprocess.Popen[str]] = []

    def start(box: Box, max_tokens: int, text: str) -> subprocess.Popen[str]:
        args = ("stream", MODEL, str(max_tokens), text)
        proc = subprocess.Popen(
            box.command("-m", "tests.engines.peers.box_chat", *args),
            env=box.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _line(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    found: dict[str, object] = json.loads(line)
    return found


def _end(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines, err
    last: dict[str, object] = lines[-1]
    return last


def _recorded(box: Box, *args: str) -> list[dict[str, object]]:
    """The box's flight recorder's rows (written in batches: waited for)."""
    rows: list[dict[str, object]] = []

    def found() -> bool:
        nonlocal rows
        out = box.traylm("requests", "ls", "--json", *args)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        return bool(rows)

    _wait(found, "the recorder has the request")
    return rows


def _probe(box: Box, url: str, mode: str = "none", body: object = None) -> dict[str, object]:
    """GET ``url`` from ``box``'s namespace presenting no certificate, or its own (``mode``
    "cert"); with ``body``, POST it (probe.py)."""
    extra = [json.dumps(body)] if body is not None else []
    out = box.python("-m", "tests.engines.peers.probe", url, mode, *extra)
    assert out.returncode == 0, out.stderr
    found: dict[str, object] = json.loads(out.stdout)
    return found


def _engine_requests(box: Box) -> int:
    """How many requests the box's FAKE engine took (its /fake/stats, in its namespace)."""
    engines = box.json("status")["engines"]
    assert isinstance(engines, list)
    [port] = [e["port"] for e in engines if e["engine_id"] == MODEL]
    url = f"http://127.0.0.1:{port}/fake/stats"
    out = box.python("-c", f"import urllib.request as u; print(u.urlopen({url!r}).read().decode())")
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["requests"])


@pytest.fixture
def pair(boxes: dict[str, Box], tmp_path: Path) -> Iterator[tuple[Box, Box]]:
    """Boxes A and B running and paired, each with the "chat" profile (FAKE engine on its
    simulated GPU, a token every 50 ms), asking each other what they serve twice a second.
    Engines of a daemon the test killed are reaped at the end as its next start would."""
    a, b = boxes["a"], boxes["b"]
    make_fake_vllm_env(tmp_path / "envs", device="cuda")
    folder = tmp_path / "model"  # a model folder: the namespaces reach no Hugging Face Hub
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for box in (a, b):
        paths = Paths.from_env(box.env)
        config = tomllib.loads(paths.config_file.read_text())
        config["peers"]["replicas_poll_s"] = 0.5
        write_toml_atomic(paths.config_file, config)
        write_toml_atomic(
            paths.profiles_dir / f"{MODEL}.toml",
            {"model": str(folder), "served_name": MODEL, "device": "cuda", "gpus": "auto",
             "env": {"FAKE_ENGINE_ARGS": "--token-delay 0.05"}},
        )  # fmt: skip
        box.serve()
    paired = b.traylm("pair", a.address, str(a.json("pair")["code"]))
    assert paired.returncode == 0, paired.stderr
    try:
        yield a, b
    finally:
        for box in (a, b):
            box.stop()
        for box in (a, b):
            reap_orphans(PidRegistry(Paths.from_env(box.env).engine_pids_json))


def test_a_model_on_box_b_answers_through_box_a_streamed(
    pair: tuple[Box, Box],
    streams: Callable[[Box, int, str], subprocess.Popen[str]],
    boxes: dict[str, Box],
) -> None:
    a, b, c = *pair, boxes["c"]
    _load(b)
    _wait(lambda: _sees_b(a), "box A lists B's chat as ready")
    [row] = [r for r in _ps(a) if r["box"] == "box-b"]
    assert (row["name"], row["gpus"], row["origin"]) == (MODEL, [0], "box")
    table = a.traylm("ps").stdout
    [line] = [x for x in table.splitlines() if x.startswith("chat @box-b")]
    assert "ready" in line and "served by box-b" in line and "on box-b: GPU 0 " in line, line

    stream = streams(a, 8, "Hello")
    assert _line(stream) == {"engine": ON_B}  # A has "chat" unloaded: B's ready one serves
    done = _end(stream)
    assert done == {"chunks": 8, "error": ""}, done
    assert _engine_requests(b) == 1
    assert a.json("status")["boxes"]["box-b"]["models"] == [MODEL]  # type: ignore[index]
    # each recorder has it: A's as its client's request served by B's copy, B's as box A's
    [asked] = _recorded(a)
    assert (asked["client"], asked["engine_id"], asked["status"]) == ("local", ON_B, 200), asked
    [served] = _recorded(b, "--client", "box")
    assert (served["peer"], served["engine_id"], served["status"]) == ("box-a", MODEL, 200), served

    # box C is not paired: the serving routes refuse it, as every peer route does
    for path in ("/peer/models", "/v1/chat/completions"):
        refused = _probe(c, f"https://10.77.1.1:{PEER_PORT}{path}")
        assert refused["status"] == 403 and "not paired" in str(refused["body"]), refused

    out = b.traylm("config", "set", "peers.share_models", "false")
    assert out.returncode == 0, out.stderr
    _wait(lambda: not _sees_b(a), "A stops using B's chat")
    [again] = _chats(a, 1)
    assert again == {"engine": MODEL, "error": ""}  # loaded on A itself now


def test_a_model_only_box_b_serves_is_listed_and_named_when_b_is_away(
    pair: tuple[Box, Box],
) -> None:
    a, b = pair
    chat = Paths.from_env(b.env).profiles_dir / f"{MODEL}.toml"
    profile = {**tomllib.loads(chat.read_text()), "served_name": "only-b"}
    write_toml_atomic(chat.with_name("only-b.toml"), profile)
    out = b.traylm("load", "only-b", "--timeout", "120", timeout_s=150)
    assert out.returncode == 0, out.stderr
    _wait(lambda: any(m["name"] == "only-b" for m in _ps(a, "--all")), "A lists only-b")
    [listed] = [m for m in _ps(a, "--all") if m["name"] == "only-b"]
    assert (listed["kind"], listed["status"], listed["detail"]) == ("box", "loaded", "on box-b")

    b.stop()
    _wait(lambda: not _sees_b_model(a, "only-b"), "A marks box B away")
    asked = a.python("-m", "tests.engines.peers.box_chat", "many", "only-b", "1")
    [answer] = [json.loads(x) for x in asked.stdout.splitlines()]
    assert "'only-b' is served only by another box, which is away" in str(answer["error"])
    assert "box 'box-b' at 10.77.0.2:8471 is not reachable" in str(answer["error"])


def _sees_b_model(a: Box, name: str) -> bool:
    return any(r["name"] == name and r["box"] == "box-b" and r["state"] == "ready" for r in _ps(a))


def test_requests_spread_over_a_local_and_a_remote_replica(pair: tuple[Box, Box]) -> None:
    a, b = pair
    _load(a)
    _load(b)
    _wait(lambda: _sees_b(a), "box A lists B's chat as ready")
    answers = _chats(a, 6)
    assert [x["error"] for x in answers] == [""] * 6, answers
    engines = [x["engine"] for x in answers]
    assert engines.count(MODEL) == 3 and engines.count(ON_B) == 3, engines  # ties alternate
    assert _engine_requests(a) == 3 and _engine_requests(b) == 3


def test_a_killed_box_tells_its_streams_then_requests_go_to_a_and_it_comes_back(
    pair: tuple[Box, Box], streams: Callable[[Box, int, str], subprocess.Popen[str]]
) -> None:
    a, b = pair
    _load(a)
    _load(b)
    _wait(lambda: _sees_b(a), "box A lists B's chat as ready")
    first = streams(a, 200, "Tell me a long story.")
    one = _line(first)["engine"]
    second = streams(a, 200, "Tell me another.")  # the other replica: fewer outstanding
    two = _line(second)["engine"]
    assert {one, two} == {MODEL, ON_B}
    on_b, on_a = (first, second) if one == ON_B else (second, first)
    assert _line(on_b) == {"chunk": 1}
    assert b.proc is not None
    b.proc.send_signal(signal.SIGKILL)  # B's daemon only: it goes away without a word
    b.proc.wait()
    b.proc = None

    broken = _end(on_b)
    assert broken["error"] and int(broken["chunks"]) < 200, broken  # the error event came
    assert ON_B in str(broken["error"])
    assert _end(on_a) == {"chunks": 200, "error": ""}
    after = _chats(a, 3)
    assert [(x["engine"], x["error"]) for x in after] == [(MODEL, "")] * 3, after
    _wait(lambda: not _sees_b(a), "A marks box B away")
    [row] = [r for r in _ps(a) if r["box"] == "box-b"]
    assert row["state"] == "away" and "box 'box-b' at 10.77.0.2:8471" in str(row["detail"])

    b.serve()  # its killed engine is reaped at start: B loads chat again
    _load(b)
    _wait(lambda: _sees_b(a), "box A uses B again")
    engines = [x["engine"] for x in _chats(a, 4)]
    assert ON_B in engines and MODEL in engines, engines


def test_a_paired_box_reaches_only_what_peer_models_lists(pair: tuple[Box, Box]) -> None:
    """B attached a server of its own ("asynth"); A, with its paired certificate on B's peer
    listener, reaches B's own ready engine and nothing else: not B's attached servers, which
    /peer/models does not list either."""
    a, b = pair
    _load(b)
    engines = b.json("status")["engines"]
    assert isinstance(engines, list)
    [port] = [e["port"] for e in engines if e["engine_id"] == MODEL]
    out = b.traylm("attach", "asynth", f"http://127.0.0.1:{port}/v1")
    assert out.returncode == 0, out.stdout + out.stderr
    peer = f"https://{b.address}:{PEER_PORT}"
    listed = _probe(a, peer + "/peer/models", "cert")
    assert listed["status"] == 200, listed
    names = [n for m in json.loads(str(listed["body"]))["models"] for n in m["names"]]
    assert MODEL in names and "asynth" not in names
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    served = _probe(a, peer + "/v1/chat/completions", "cert", {**ask, "model": MODEL})
    assert served["status"] == 200, served
    refused = _probe(a, peer + "/v1/chat/completions", "cert", {**ask, "model": "asynth"})
    assert refused["status"] == 404, refused
    assert "not one of the models box 'box-b' shares" in str(refused["body"]), refused
