"""Placing replicas (planner.plan_copies, copy_cards): two copies that each fit one card go one
per card; a copy that fits no card refuses with the tensor-parallel fix; a second copy that
finds no room says how many fit; copies on the CPU book host RAM each."""

from __future__ import annotations

from collections.abc import Sequence

from engines.events.models import Placement
from engines.ondemand.planner import (
    HOST_RAM_MARGIN_BYTES,
    Card,
    Request,
    Resident,
    copy_cards,
    plan,
    plan_copies,
    plan_host,
)
from engines.runtime.adapters.memory import GIB, cpu_need, vllm_need
from tests.engines.ondemand.test_planner import CARD, HOST, cards, resident, vllm


def copies(
    request: Request, count: int, on: list[Card], residents: Sequence[Resident] = ()
) -> tuple[Placement, ...] | Placement:
    taken: set[int] = set()

    def one(_: int, now: Sequence[Resident], host: int) -> Placement:
        found = plan(request, copy_cards(on, taken, request.world_size), now, host_free_bytes=host)
        taken.update(found.gpus)
        return found

    return plan_copies(
        request.model,
        count,
        one,
        residents,
        host_free_bytes=HOST,
        gpus_per_copy=request.world_size,
    )


def test_two_copies_that_fit_one_card_each_go_one_per_card() -> None:
    found = copies(Request("m", 1, vllm(0.9)), 2, cards(0, 0))
    assert isinstance(found, tuple)
    assert [p.gpus for p in found] == [(0,), (1,)]
    # small copies too: the second goes to the card no copy took, not beside the first
    small = copies(Request("m", 1, vllm(0.3)), 2, cards(0, 0))
    assert isinstance(small, tuple) and [p.gpus for p in small] == [(0,), (1,)]


def test_a_copy_too_big_for_one_card_suggests_tensor_parallel() -> None:
    def big(card: Card, free: int):
        return vllm_need(
            utilization=0.9, total_bytes=card.total_bytes, weights_bytes=30 * GIB, sleep_mode=False
        )

    found = copies(Request("big", 1, big), 2, cards(0, 0))
    assert isinstance(found, Placement) and not found.fits
    assert found.reason.startswith("big cannot place one of its 2 replicas:")
    assert "tensor_parallel_size = 2, replicas = 1" in found.reason


def test_a_tp2_model_on_two_cards_has_room_for_one_copy() -> None:
    found = copies(Request("tp", 2, vllm()), 2, cards(0, 0))
    assert isinstance(found, Placement) and not found.fits
    assert "replica 2 of 2 cannot be placed beside the first" in found.reason
    assert "--replicas 1" in found.reason and "each copy spans 2 GPUs" in found.reason


def test_the_second_copy_evicts_an_idle_model_the_first_left_alone() -> None:
    idle = resident("old", (1,), used=1.0)
    found = copies(Request("m", 1, vllm()), 2, cards(0, 0), [idle])
    assert isinstance(found, tuple)
    assert found[0].gpus == (0,) and not found[0].evictions
    assert found[1].gpus == (1,) and [e.engine_id for e in found[1].evictions] == ["old"]


def test_a_busy_card_leaves_room_for_one_copy_only() -> None:
    busy = resident("busy", (1,), used=1.0, busy=True)
    found = copies(Request("m", 1, vllm()), 2, cards(0, 0), [busy])
    assert isinstance(found, Placement) and not found.fits
    assert "There is room for 1" in found.reason and "busy" in found.reason


def test_cpu_copies_book_host_ram_each() -> None:
    need = cpu_need(weights_bytes=4 * GIB, kv_cache_bytes=4 * GIB)
    host = HOST_RAM_MARGIN_BYTES + 2 * need.free_needed_bytes + GIB

    def one(_: int, now: Sequence[Resident], free: int) -> Placement:
        return plan_host("m", need, now, host_free_bytes=free)

    two = plan_copies("m", 2, one, [], host_free_bytes=host, gpus_per_copy=0)
    assert isinstance(two, tuple) and [p.host_bytes for p in two] == [need.hold_bytes] * 2
    three = plan_copies("m", 3, one, [], host_free_bytes=host, gpus_per_copy=0)
    assert isinstance(three, Placement) and not three.fits
    assert "replica 3 of 3" in three.reason and "of host RAM" in three.reason
    assert "tensor" not in three.reason  # nothing about GPUs for CPU copies


def test_copy_cards_prefers_cards_no_copy_took() -> None:
    on = cards(0, 0, reserved=(1,))
    assert [c.index for c in copy_cards(on, {0}, 1)] == [0, 1]  # only a reserved one is left
    assert [c.index for c in copy_cards(cards(0, 0), {0}, 1)] == [1]
    assert CARD and HOST  # the shared test sizes
