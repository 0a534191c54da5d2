"""The placement planner (engines/ondemand/planner.py): pure, so every rule is checked on
hand-built cards: most headroom, TP 2, other programs' memory, reserved cards, LRU eviction that
never touches busy or pinned models, sleep before stop, and a refusal that says why."""

from __future__ import annotations

from engines.ondemand.planner import HOST_RAM_MARGIN_BYTES, Card, Request, Resident, plan, plan_host
from engines.runtime.adapters.memory import GIB, MemoryNeed, cpu_need, sglang_need, vllm_need

CARD = 24 * GIB
HOST = 64 * GIB


def vllm(utilization: float = 0.9, *, sleep: bool = False):
    def need(card: Card, free: int) -> MemoryNeed:
        return vllm_need(
            utilization=utilization,
            total_bytes=card.total_bytes,
            weights_bytes=None,
            sleep_mode=sleep,
        )

    return need


def cards(*others: int, reserved: tuple[int, ...] = ()) -> list[Card]:
    return [
        Card(
            i,
            "RTX 4090",
            CARD,
            other,
            (f"pid {100 + i} (game)",) if other > GIB else (),
            reserved=i in reserved,
        )
        for i, other in enumerate(others)
    ]


def resident(
    name: str,
    gpus: tuple[int, ...],
    *,
    used: float,
    busy: bool = False,
    pinned: bool = False,
    hold: int = int(CARD * 0.9),
    sleep: bool = False,
    sleeping: bool = False,
) -> Resident:
    return Resident(
        name,
        gpus,
        GIB if sleeping else hold,
        busy,
        pinned,
        used,
        sleeping,
        (hold - GIB) if sleep else None,
        8 * GIB,
    )


def test_one_card_model_goes_where_it_has_the_most_headroom() -> None:
    found = plan(Request("m", 1, vllm(0.5)), cards(4 * GIB, GIB), [], host_free_bytes=HOST)
    assert found.fits and found.gpus == (1,) and not found.evictions
    assert "needs 12.5 GiB" in found.reason and "0.50 of the card" in found.reason
    assert "plus 0.5 GiB for its CUDA context" in found.reason


def test_another_program_holding_memory_counts() -> None:
    # GPU 0 would be chosen (lower index) if the game's 6 GiB on it were ignored
    found = plan(Request("m", 1, vllm(0.5)), cards(6 * GIB, 0), [], host_free_bytes=HOST)
    assert found.gpus == (1,)
    none = plan(Request("m", 1, vllm(0.9)), cards(6 * GIB, 6 * GIB), [], host_free_bytes=HOST)
    assert not none.fits
    assert "held by other programs and the driver (pid 100 (game))" in none.reason


def test_tp2_needs_both_cards_and_reserved_cards_stay_out() -> None:
    both = plan(Request("big", 2, vllm()), cards(0, 0), [], host_free_bytes=HOST)
    assert both.fits and both.gpus == (0, 1)
    one = plan(Request("m", 1, vllm()), cards(0, 0, reserved=(0,)), [], host_free_bytes=HOST)
    assert one.gpus == (1,)
    refused = plan(Request("big", 2, vllm()), cards(0, 0, reserved=(0,)), [], host_free_bytes=HOST)
    assert not refused.fits and "reserved in gpu.reserved" in refused.reason
    # a fixed set may name a reserved card (the profile says so)
    fixed = plan(
        Request("m", 1, vllm(), gpus=(0,)), cards(0, 0, reserved=(0,)), [], host_free_bytes=HOST
    )
    assert fixed.fits and fixed.gpus == (0,)


def test_a_gpu_that_does_not_exist_and_a_wrong_count_are_refused() -> None:
    missing = plan(Request("m", 1, vllm(), gpus=(3,)), cards(0, 0), [], host_free_bytes=HOST)
    assert not missing.fits and missing.reason == "GPU 3 does not exist; the GPUs here are 0, 1"
    count = plan(Request("m", 1, vllm(), gpus=(0, 1)), cards(0, 0), [], host_free_bytes=HOST)
    assert "runs on 1 GPU(s)" in count.reason


def test_eviction_takes_the_least_recently_used_idle_model_never_busy_or_pinned() -> None:
    residents = [
        resident("old", (0,), used=1.0),
        resident("new", (1,), used=5.0),
    ]
    found = plan(Request("m", 1, vllm()), cards(0, 0), residents, host_free_bytes=HOST)
    assert found.fits and found.gpus == (0,)
    assert [(e.engine_id, e.action) for e in found.evictions] == [("old", "stop")]
    busy_old = [resident("old", (0,), used=1.0, busy=True), resident("new", (1,), used=5.0)]
    found = plan(Request("m", 1, vllm()), cards(0, 0), busy_old, host_free_bytes=HOST)
    assert [e.engine_id for e in found.evictions] == ["new"] and found.gpus == (1,)
    pinned = [resident("old", (0,), used=1.0, pinned=True), resident("new", (1,), used=5.0)]
    found = plan(Request("m", 1, vllm()), cards(0, 0), pinned, host_free_bytes=HOST)
    assert [e.engine_id for e in found.evictions] == ["new"]


def test_tp2_evicts_from_both_cards_in_lru_order() -> None:
    residents = [
        resident("b", (1,), used=2.0),
        resident("a", (0,), used=1.0),
        resident("c", (1,), used=3.0, hold=4 * GIB),
    ]
    found = plan(Request("big", 2, vllm()), cards(0, 0), residents, host_free_bytes=HOST)
    assert found.fits
    assert [e.engine_id for e in found.evictions] == ["a", "b", "c"]


def test_nothing_evictable_gives_the_reason_and_busy_means_retry_later() -> None:
    residents = [
        resident("x", (0,), used=1.0, busy=True),
        resident("y", (1,), used=2.0, pinned=True),
    ]
    found = plan(Request("m", 1, vllm()), cards(0, 0), residents, host_free_bytes=HOST)
    assert not found.fits and found.retry_later
    assert "x 21.6 GiB (busy)" in found.reason and "y 21.6 GiB (pinned)" in found.reason
    assert "needs 22.1 GiB free on one of 1 GPU(s)" in found.reason  # 0.9 x 24 + its context
    assert "retry shortly" in found.reason
    pinned_only = [
        resident("y", (0,), used=2.0, pinned=True),
        resident("z", (1,), used=2.0, pinned=True),
    ]
    found = plan(Request("m", 1, vllm()), cards(0, 0), pinned_only, host_free_bytes=HOST)
    assert not found.fits and not found.retry_later and "traylm unload NAME" in found.reason


def test_sleep_first_when_host_ram_takes_the_weights_else_stop() -> None:
    small = 10 * GIB  # two half-card vLLM models fit on one card once one sleeps
    residents = [
        resident("a", (0,), used=1.0, hold=small, sleep=True),
        resident("b", (0,), used=2.0, hold=small, sleep=True),
    ]
    found = plan(Request("m", 1, vllm(0.45), gpus=(0,)), cards(0), residents, host_free_bytes=HOST)
    assert [(e.engine_id, e.action) for e in found.evictions] == [("a", "sleep")]
    no_ram = plan(
        Request("m", 1, vllm(0.45), gpus=(0,)), cards(0), residents, host_free_bytes=6 * GIB
    )
    assert [(e.engine_id, e.action) for e in no_ram.evictions] == [("a", "stop")]


def test_sleeping_models_go_first_and_sglang_needs_what_is_free() -> None:
    residents = [
        resident("awake", (0,), used=1.0, hold=10 * GIB),
        resident("asleep", (0,), used=5.0, sleeping=True, sleep=True),
    ]

    def sglang(card: Card, free: int) -> MemoryNeed:
        return sglang_need(fraction=0.8, free_bytes=free, weights_bytes=10 * GIB)

    found = plan(Request("s", 1, sglang, gpus=(0,)), cards(0), residents, host_free_bytes=HOST)
    assert found.fits and [e.engine_id for e in found.evictions] == ["asleep"]
    assert found.need_bytes_per_gpu == CARD - 10 * GIB  # all that is then free


def test_between_cards_the_least_recently_used_model_goes() -> None:
    residents = [resident("newer", (0,), used=9.0), resident("older", (1,), used=2.0)]
    found = plan(Request("m", 1, vllm()), cards(0, 0), residents, host_free_bytes=HOST)
    assert found.gpus == (1,) and [e.engine_id for e in found.evictions] == ["older"]


def cpu_resident(name: str, *, used: float, busy: bool = False, pinned: bool = False) -> Resident:
    return Resident(name, (), 3 * GIB, busy, pinned, used)


def test_a_cpu_model_books_host_ram_and_stops_the_lru_idle_cpu_model_for_room() -> None:
    need = cpu_need(weights_bytes=GIB, kv_cache_bytes=GIB)  # + 1 GiB runtime = 3 GiB
    assert need.hold_bytes == 3 * GIB and "host RAM" in need.rule
    found = plan_host("c", need, [], host_free_bytes=HOST_RAM_MARGIN_BYTES + 3 * GIB)
    assert found.fits and found.on_cpu and found.host_bytes == 3 * GIB and not found.gpus
    residents = [cpu_resident("old", used=1.0), cpu_resident("new", used=2.0)]
    found = plan_host("c", need, residents, host_free_bytes=HOST_RAM_MARGIN_BYTES + GIB)
    assert found.fits and [(e.engine_id, e.action) for e in found.evictions] == [("old", "stop")]


def test_a_cpu_model_without_room_is_refused_with_what_holds_the_ram() -> None:
    need = cpu_need(weights_bytes=None, kv_cache_bytes=2 * GIB)
    busy = [cpu_resident("b", used=1.0, busy=True)]
    found = plan_host("c", need, busy, host_free_bytes=HOST_RAM_MARGIN_BYTES + GIB)
    assert not found.fits and found.retry_later  # b finishing its requests makes room
    assert "c needs 3.0 GiB of host RAM" in found.reason and "b 3.0 GiB (busy)" in found.reason
    pinned = [cpu_resident("p", used=1.0, pinned=True)]
    found = plan_host("c", need, pinned, host_free_bytes=HOST_RAM_MARGIN_BYTES + GIB)
    assert not found.fits and not found.retry_later
    assert "p 3.0 GiB (pinned)" in found.reason and "cpu_kv_cache_gib" in found.reason
