"""The replica balancer (engines/gateway/balance.py): fewest outstanding, ties spread, a
conversation sticks to its replica while that one is not much busier, a stored response's
replica always wins, an unreachable replica is avoided, and the conversation key is the same
for every turn of one conversation."""

from __future__ import annotations

from engines.gateway.balance import Affinity, Balancer, Replica, affinity_key


def chat(*turns: str, system: str = "be brief") -> dict[str, object]:
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages}


def test_the_least_busy_replica_takes_a_new_request() -> None:
    b = Balancer()
    assert b.pick([Replica("a", 3), Replica("b", 1), Replica("c", 2)]).name == "b"


def test_ties_rotate_so_concurrent_requests_spread() -> None:
    b = Balancer()
    picked = {b.pick([Replica("a", 0), Replica("b", 0)]).name for _ in range(4)}
    assert picked == {"a", "b"}


def test_a_conversation_sticks_while_its_replica_is_not_much_busier() -> None:
    b = Balancer(slack=2)
    first = Affinity(chat("hello"))
    home = b.pick([Replica("a", 0), Replica("b", 0)], first).name
    other = "b" if home == "a" else "a"
    later = Affinity(chat("hello", "hi there", "and now?"))
    for load in (0, 1, 2):  # up to `slack` more outstanding than the other
        loads = [Replica(home, load), Replica(other, 0)]
        assert b.pick(loads, later).name == home
    moved = b.pick([Replica(home, 3), Replica(other, 0)], later).name
    assert moved == other  # much busier: the conversation moves, and sticks there now
    assert b.pick([Replica(home, 0), Replica(other, 0)], later).name == other


def test_another_conversation_is_balanced_on_its_own() -> None:
    b = Balancer()
    one = b.pick([Replica("a", 0), Replica("b", 0)], Affinity(chat("one"))).name
    two = b.pick([Replica("a", 0), Replica("b", 0)], Affinity(chat("two"))).name
    assert one != two  # ties rotate: the second conversation went to the other replica


def test_the_replica_holding_a_stored_response_wins_whatever_its_load() -> None:
    b = Balancer()
    found = b.pick([Replica("a", 9), Replica("b", 0)], Affinity({"input": "x"}, owner="a"))
    assert found.name == "a"


def test_an_avoided_replica_is_left_out_while_another_is_there() -> None:
    b = Balancer()
    avoid = Affinity(chat("x"), avoid=frozenset({"b"}))
    assert b.pick([Replica("a", 5), Replica("b", 0)], avoid).name == "a"
    assert b.pick([Replica("b", 0)], avoid).name == "b"  # the only one left


def test_a_gone_replica_hands_its_conversations_on() -> None:
    b = Balancer()
    talk = Affinity(chat("hello"))
    b.pick([Replica("a", 0)], talk)
    assert b.pick([Replica("b", 0), Replica("c", 1)], talk).name == "b"


def test_the_map_of_conversations_is_bounded() -> None:
    b = Balancer(remember=3)
    keys = [Affinity(chat(f"c{i}")) for i in range(5)]
    for k in keys:
        b.pick([Replica("a", 0)], k)
    assert keys[0].key is not None and b.replica_of(keys[0].key) is None
    assert keys[4].key is not None and b.replica_of(keys[4].key) == "a"


def test_every_turn_of_a_conversation_has_its_key() -> None:
    assert affinity_key(chat("hello")) == affinity_key(chat("hello", "hi", "more"))
    no_system = {"messages": [{"role": "user", "content": "q"}]}
    later = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert affinity_key(no_system) == affinity_key(later)
    assert affinity_key(chat("hello")) != affinity_key(chat("hello", system="other"))
    anthropic = {"system": "s", "messages": [{"role": "user", "content": "q"}]}
    assert affinity_key(anthropic) == affinity_key({**anthropic, "max_tokens": 9})
    responses = {"instructions": "i", "input": "q"}
    assert affinity_key(responses) is not None
    assert affinity_key({"prompt": "a" * 10_000}) == affinity_key({"prompt": "a" * 9_000})
    assert affinity_key({"model": "m"}) is None


def test_a_replica_quiet_with_requests_waiting_is_passed_over_while_another_is_not() -> None:
    from engines.gateway.balance import QUIET_S, Balancer, Replica

    b = Balancer()
    stuck = Replica("a", 1, quiet_s=QUIET_S + 0.5)  # fewer outstanding, but no progress
    busy = Replica("b", 3)
    assert {b.pick([stuck, busy]).name for _ in range(4)} == {"b"}
    # every replica quiet: the usual choice (fewest outstanding)
    assert b.pick([stuck, Replica("b", 3, quiet_s=QUIET_S + 1)]).name == "a"
