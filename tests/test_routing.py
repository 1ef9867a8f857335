"""Routing decisions: pure code, driven with an explicit clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.activities.routing import Candidate, ReplicaTable, choose, imbalanced
from rollart.config import RoutingConfig
from rollart.contracts import RouteRequest

CACHE_AWARE = RoutingConfig(balance_abs_threshold=4, balance_rel_threshold=1.5,
                            progress_tokens=100)


def request(rid: str, tid: str, group: str = "g0", context: int = 0,
            pools=(("a", 2),), policy: str = "cache_aware") -> RouteRequest:
    routing = CACHE_AWARE.model_copy(update={"policy": policy})
    return RouteRequest(request_id=rid, trajectory_id=tid, group_id=group,
                        context_tokens=context, pools=list(pools), routing=routing)


def cands(**loads: int) -> list[Candidate]:
    return [Candidate(queue, load, k) for k, (queue, load) in enumerate(loads.items())]


def test_imbalance_needs_both_thresholds():
    assert not imbalanced([10, 7], 4, 1.5)  # difference 3 <= 4
    assert not imbalanced([30, 25], 4, 1.5)  # difference 5, but 30 < 1.5 * 25
    assert imbalanced([30, 10], 4, 1.5)


def test_cache_aware_keeps_a_trajectory_on_its_prefix_replica():
    queue, reason = choose("cache_aware", cands(r0=6, r1=3), home="r0", group_home=None,
                           context_tokens=0, turn_counter=0, config=CACHE_AWARE)
    assert (queue, reason) == ("r0", "prefix")


def test_cache_aware_rebalances_when_the_home_is_overloaded():
    queue, reason = choose("cache_aware", cands(r0=12, r1=2), home="r0", group_home=None,
                           context_tokens=0, turn_counter=0, config=CACHE_AWARE)
    assert (queue, reason) == ("r1", "rebalanced")


def test_progress_makes_a_long_trajectory_stickier():
    loads = cands(r0=12, r1=2)  # imbalance 10: more than 4, so a fresh trajectory moves...
    short = choose("cache_aware", loads, "r0", None, 0, 0, CACHE_AWARE)
    # ...but one holding 800 tokens there tolerates 4 + 800/100 = 12 before it moves.
    long = choose("cache_aware", loads, "r0", None, 800, 0, CACHE_AWARE)
    assert short[0] == "r1" and long == ("r0", "prefix")


def test_new_trajectory_follows_its_group_then_least_loaded():
    assert choose("cache_aware", cands(r0=3, r1=1), None, "r0", 0, 0, CACHE_AWARE) == (
        "r0", "group")
    assert choose("cache_aware", cands(r0=3, r1=1), None, None, 0, 0, CACHE_AWARE) == (
        "r1", "least_loaded")
    # a home that is not among the live candidates is ignored
    assert choose("cache_aware", cands(r1=5), "r0", None, 0, 0, CACHE_AWARE)[0] == "r1"


def test_baselines():
    loads = cands(r0=5, r1=1, r2=3)
    assert [choose("round_robin", loads, "r0", None, 0, k, CACHE_AWARE)[0]
            for k in range(4)] == ["r0", "r1", "r2", "r0"]
    assert choose("least_loaded", loads, "r0", "r0", 0, 0, CACHE_AWARE)[0] == "r1"
    with pytest.raises(ValueError, match="unknown policy"):
        choose("random", loads, None, None, 0, 0, CACHE_AWARE)


def test_table_tracks_load_and_homes():
    table = ReplicaTable()
    first = table.route(request("t1.0", "t1"), now=0)
    sibling = table.route(request("t2.0", "t2"), now=0)
    assert sibling.queue == first.queue and sibling.reason == "group"
    assert table.loads[first.queue] == 2
    table.release("t1.0", "ok", now=1)
    table.release("t2.0", "ok", now=1)
    assert table.loads[first.queue] == 0
    again = table.route(request("t1.1", "t1", context=50), now=2)
    assert again.queue == first.queue and again.reason == "prefix"
    table.release("t1.0", "ok", now=3)  # a second release of the same request changes nothing
    assert table.loads[first.queue] == 1


def test_unreachable_replica_is_avoided_then_probed_once_then_restored():
    table = ReplicaTable()
    pools = (("fast", 1), ("backup", 1))
    first = table.route(request("a.0", "a", pools=pools), now=0)
    assert (first.pool, first.fallback) == ("fast", False)
    table.release("a.0", "unreachable", now=5, down_s=10)
    moved = table.route(request("a.1", "a", pools=pools), now=6)
    assert (moved.pool, moved.fallback) == ("backup", True)
    assert table.fallbacks == {"fast->backup": 1}
    # after down_s one request probes the pool; the others keep going to the fallback
    probe = table.route(request("b.0", "b", group="g1", pools=pools), now=16)
    other = table.route(request("c.0", "c", group="g2", pools=pools), now=16)
    assert probe.pool == "fast" and other.pool == "backup"
    table.release("b.0", "ok", now=17)
    back = table.route(request("d.0", "d", group="g3", pools=pools), now=18)
    assert (back.pool, back.fallback) == ("fast", False)


def test_failed_probe_marks_the_replica_down_again():
    table = ReplicaTable()
    pools = (("fast", 1), ("backup", 1))
    table.route(request("a.0", "a", pools=pools), now=0)
    table.release("a.0", "unreachable", now=0, down_s=10)
    probe = table.route(request("b.0", "b", group="g1", pools=pools), now=11)
    assert probe.pool == "fast"
    table.release("b.0", "unreachable", now=12, down_s=10)
    assert table.route(request("c.0", "c", group="g2", pools=pools), now=13).pool == "backup"


def test_a_busy_replica_is_not_marked_down():
    """It did not serve in time but answered a ping: its queue is full, it is not dead."""
    table = ReplicaTable()
    pools = (("fast", 1), ("backup", 1))
    table.route(request("a.0", "a", pools=pools), now=0)
    table.release("a.0", "busy", now=5, down_s=10)
    assert table.loads["rollart.gen.fast.r0"] == 0
    again = table.route(request("a.1", "a", pools=pools), now=6)
    assert (again.pool, again.fallback) == ("fast", False)


def test_everything_down_still_routes_to_the_domains_pool():
    table = ReplicaTable()
    pools = (("fast", 1), ("backup", 1))
    for rid, now in (("a.0", 0), ("a.1", 0)):
        decision = table.route(request(rid, "a", pools=pools), now=now)
        table.release(rid, "unreachable", now=now, down_s=10)
    decision = table.route(request("a.2", "a", pools=pools), now=1)
    assert decision.pool == "fast" and not decision.fallback


def test_forgotten_requests_expire():
    table = ReplicaTable(in_flight_expiry_s=60)
    decision = table.route(request("a.0", "a"), now=0)
    table.route(request("b.0", "b", group="g1"), now=100)
    assert "a.0" not in table.in_flight and sum(table.loads.values()) == 1
    assert table.loads[decision.queue] == 1  # both idle again: b.0 took the first replica


@given(st.lists(st.tuples(st.integers(0, 7), st.booleans()), min_size=1, max_size=200))
def test_cache_aware_never_piles_onto_a_busy_replica(events):
    """Whatever the arrival and completion order, cache-aware routing never places a request on
    a replica carrying more than the threshold above the least busy one."""
    table = ReplicaTable()
    routing = RoutingConfig(balance_abs_threshold=4, balance_rel_threshold=1.0,
                            progress_tokens=10**9)
    queues = [f"rollart.gen.a.r{r}" for r in range(3)]
    open_requests: list[str] = []
    for k, (trajectory, finish_one) in enumerate(events):
        rid = f"t{trajectory}.{k}"
        before = {q: table.loads.get(q, 0) for q in queues}
        decision = table.route(RouteRequest(request_id=rid, trajectory_id=f"t{trajectory}",
                                            group_id=f"g{trajectory % 2}", pools=[("a", 3)],
                                            routing=routing), now=k)
        assert before[decision.queue] - min(before.values()) <= routing.balance_abs_threshold
        open_requests.append(rid)
        if finish_one and open_requests:
            table.release(open_requests.pop(0), "ok", now=k)
    assert sum(table.loads.values()) == len(open_requests)
