"""Gateway building blocks: admission control, Prometheus exposition, request guards."""

from __future__ import annotations

import asyncio

import pytest

from engines.core.metrics import MetricsRegistry
from engines.gateway.admission import Admission, QueueFull
from engines.gateway.security import Guard, hash_key
from engines.gateway.sse import ends_reply, whole_events


async def test_admission_queues_in_order_then_refuses() -> None:
    adm = Admission(max_concurrent=1, max_queue=2, queue_timeout_s=5)
    order: list[int] = []
    release = asyncio.Event()

    async def job(i: int) -> None:
        async with adm.slot():
            order.append(i)
            await release.wait()

    first = asyncio.create_task(job(0))
    await asyncio.sleep(0.01)
    queued = [asyncio.create_task(job(i)) for i in (1, 2)]
    await asyncio.sleep(0.01)
    assert adm.in_flight == 1 and adm.waiting == 2
    with pytest.raises(QueueFull, match="queued"):
        async with adm.slot():
            pass
    release.set()
    await asyncio.gather(first, *queued)
    assert order == [0, 1, 2] and adm.in_flight == 0 and adm.waiting == 0


async def test_admission_queue_timeout() -> None:
    adm = Admission(max_concurrent=1, max_queue=5, queue_timeout_s=0.1)
    async with adm.slot():
        with pytest.raises(QueueFull, match="waited 0.1 s"):
            async with adm.slot():
                pass
    assert adm.waiting == 0 and adm.in_flight == 0


async def test_admission_a_waiter_that_goes_away_frees_its_place_and_its_slot() -> None:
    """A queued request cancelled (its client left) leaves the queue; one cancelled in the very
    step its slot was handed over passes the slot on, so no slot is ever lost."""
    adm = Admission(max_concurrent=1, max_queue=5, queue_timeout_s=5)
    got: list[str] = []

    async def job(name: str) -> None:
        async with adm.slot():
            got.append(name)

    held = adm.slot()
    await held.__aenter__()
    gone, handed, last = (asyncio.create_task(job(n)) for n in ("gone", "handed", "last"))
    await asyncio.sleep(0.01)
    assert adm.waiting == 3 and adm.in_flight == 1
    gone.cancel()  # queued, then cancelled: out of the queue
    await asyncio.sleep(0.01)
    assert adm.waiting == 2 and adm.in_flight == 1
    await held.__aexit__(None, None, None)  # the slot is handed to "handed" ...
    handed.cancel()  # ... which is cancelled before it ran: the slot goes on to "last"
    await asyncio.wait_for(last, 10)  # a lost slot would leave it queued
    assert handed.cancelled() and got == ["last"]
    assert adm.in_flight == 0 and adm.waiting == 0 and adm.idle_since_s is not None


def test_prometheus_exposition() -> None:
    reg = MetricsRegistry()
    c = reg.counter("x_total", "X.")
    c.inc(route="/a", status="200")
    c.inc(2, route="/a", status="200")
    h = reg.histogram("lat_seconds", "L.", buckets=(0.1, 1.0))
    h.observe(0.05, m="q")
    h.observe(0.5, m="q")
    h.observe(5.0, m="q")
    reg.gauge("g", "G.", lambda: {(("e", 'a"b'),): 1.5})
    text = reg.render()
    assert 'x_total{route="/a",status="200"} 3' in text
    assert 'lat_seconds_bucket{m="q",le="0.1"} 1' in text
    assert 'lat_seconds_bucket{m="q",le="1"} 2' in text
    assert 'lat_seconds_bucket{m="q",le="+Inf"} 3' in text
    assert 'lat_seconds_count{m="q"} 3' in text and 'lat_seconds_sum{m="q"} 5.55' in text
    assert 'g{e="a\\"b"} 1.5' in text
    assert "# TYPE lat_seconds histogram" in text


def guard(**kw: object) -> Guard:
    args: dict[str, object] = {
        "hosts": (),
        "origins": (),
        "key_digests": (),
        "port": 8000,
        "lan": False,
        **kw,
    }
    return Guard.build(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("localhost:8000", True),
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("localhost", True),
        ("LOCALHOST:8000", True),
        ("127.0.0.1:9999", False),
        ("evil.example", False),
        ("localhost.evil.example:8000", False),
        ("192.168.1.5:8000", False),
        (None, False),
    ],
)
def test_host_allow_list(host: str | None, ok: bool) -> None:
    assert guard().host_ok(host) is ok


def test_lan_mode_accepts_ip_literals_but_not_names() -> None:
    g = guard(lan=True, hosts=("box.lan",))
    assert g.host_ok("192.168.1.5:8000") and g.host_ok("[fe80::1]:8000")
    assert g.host_ok("box.lan:8000") and not g.host_ok("rebind.evil.example:8000")


def test_origins_are_exact() -> None:
    g = guard(origins=("http://localhost:3000",))
    assert g.origin_ok(None) and g.origin_ok("http://localhost:3000")
    for bad in ("http://localhost:3001", "https://localhost:3000", "null", "*"):
        assert not g.origin_ok(bad)


def test_api_keys() -> None:
    g = guard(key_digests=(hash_key("k1"), hash_key("k2")))
    assert g.keys_required
    assert g.key_ok("Bearer k1") and g.key_ok("bearer k2")
    assert not g.key_ok("Bearer k3") and not g.key_ok(None) and not g.key_ok("k1")
    assert guard().key_ok(None)  # no keys configured: open on loopback


@pytest.mark.parametrize(
    "path",
    [
        "/v1/../api/status",
        "//v1/models",
        "/v1/%2e%2e/api",
        "/v1%2fmodels",
        "/v1/models%00",
        "/v1\\models",
        "v1/models",
    ],
)
def test_non_canonical_paths_are_refused(path: str) -> None:
    assert guard().path_problem(path)


def test_canonical_paths_pass() -> None:
    assert guard().path_problem("/v1/chat/completions?x=1") is None


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        (b"", b""),
        (b"data: {", b""),
        (b"data: 1\n\n", b"data: 1\n\n"),
        (b'data: 1\n\ndata: {"cho', b"data: 1\n\n"),
        (b"data: 1\n\ndata: 2\n\n", b"data: 1\n\ndata: 2\n\n"),
        (b"data: 1\ndata: 2\n", b""),  # one event of two lines, not finished yet
        (b"data: 1\r\n\r\ndata: 2", b"data: 1\r\n\r\n"),
        (b"data: 1\n\ndata: 2\r\n\r\n", b"data: 1\n\ndata: 2\r\n\r\n"),
    ],
)
def test_only_whole_events_are_relayed(data: bytes, whole: bytes) -> None:
    assert data[: whole_events(data)] == whole


@pytest.mark.parametrize(
    ("events", "last"),
    [
        (b"data: [DONE]\n\n", True),
        (b'data: {"choices": []}\n\ndata: [DONE]\n\n', True),
        (b'data: {"choices": []}\n\n', False),
        (b'data: [DONE]\n\ndata: {"late": 1}\n\n', False),  # only the last event counts
        (b"event: message_delta\ndata: {}\n\nevent: message_stop\ndata: {}\n\n", True),
        (b"event: message_stop\r\ndata: {}\r\n\r\n", True),
        (b'event: response.output_text.delta\ndata: {"delta": "[DONE]"}\n\n', False),
        (b'event: response.completed\ndata: {"response": {}}\n\n', True),
        (b"", False),
    ],
)
def test_the_event_that_ends_a_reply_is_known(events: bytes, last: bool) -> None:
    assert ends_reply(events) is last
