"""Which generation replica serves a request: pure routing decisions, no I/O.

`choose` is one decision among the live replicas of one pool. `ReplicaTable` is the state a router
keeps between decisions: requests in flight per replica (its load), which replica served each
trajectory and each group last (where their prefixes are cached), and which replicas failed to
pick up work (down until probed again). The clock is passed in, so tests drive it directly.

The cache-aware policy follows sglang's cache_aware router: stay on the replica holding the
prefix unless the loads are imbalanced, i.e. the busiest replica carries more than
`balance_abs_threshold` requests above the least busy and `balance_rel_threshold` times its load.
Two RL-specific twists: a new trajectory follows its group's siblings (they share the prompt), and
progress counts: a trajectory holding a long context on its replica tolerates more imbalance
before moving, since moving recomputes that context.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count

from rollart.config import RoutingConfig
from rollart.contracts import RouteDecision, RouteOutcome, RouteRequest
from rollart.queues import replica_queue

MAX_REMEMBERED = 100_000


@dataclass
class Candidate:
    queue: str
    load: int
    replica: int = 0


def imbalanced(loads: list[int], abs_threshold: float, rel_threshold: float) -> bool:
    high, low = max(loads), min(loads)
    return high - low > abs_threshold and high > rel_threshold * low


def choose(policy: str, candidates: list[Candidate], home: str | None, group_home: str | None,
           context_tokens: int, turn_counter: int, config: RoutingConfig) -> tuple[str, str]:
    """(queue, reason) for one request among `candidates` (the live replicas of one pool)."""
    if not candidates:
        raise ValueError("no candidate replicas")
    least = min(candidates, key=lambda c: (c.load, c.queue))
    if policy == "round_robin":
        return candidates[turn_counter % len(candidates)].queue, "round_robin"
    if policy == "least_loaded":
        return least.queue, "least_loaded"
    if policy != "cache_aware":
        raise ValueError(f"routing.policy: unknown policy {policy!r}")
    loads = {c.queue: c.load for c in candidates}
    target, reason = (home, "prefix") if home in loads else (group_home, "group")
    if target not in loads:
        return least.queue, "least_loaded"
    slack = config.balance_abs_threshold + context_tokens / config.progress_tokens
    if imbalanced([loads[target], least.load], slack, config.balance_rel_threshold):
        return least.queue, "rebalanced"
    return target, reason


@dataclass
class _Health:
    down_until: float = 0.0
    probing: bool = False


@dataclass
class ReplicaTable:
    """Router state across requests; one per router process."""

    loads: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, tuple[str, float]] = field(default_factory=dict)
    homes: OrderedDict[str, str] = field(default_factory=OrderedDict)
    group_homes: OrderedDict[str, str] = field(default_factory=OrderedDict)
    health: dict[str, _Health] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)
    in_flight_expiry_s: float = 600.0
    _counter: count = field(default_factory=count)

    def live(self, queue: str, now: float) -> bool:
        health = self.health.get(queue)
        if health is None or health.down_until == 0.0:
            return True
        return now >= health.down_until and not health.probing

    def route(self, request: RouteRequest, now: float) -> RouteDecision:
        self._expire(now)
        primary = request.pools[0][0]
        chosen_pool, candidates = primary, []
        for pool, replicas in request.pools:
            live = [c for c in self._candidates(pool, replicas) if self.live(c.queue, now)]
            if live:
                chosen_pool, candidates = pool, live
                break
        if not candidates:  # everything is down: keep trying the domain's own pool
            candidates = self._candidates(primary, request.pools[0][1])
        queue, reason = choose(
            request.routing.policy, candidates, self.homes.get(request.trajectory_id),
            self.group_homes.get(request.group_id), request.context_tokens,
            next(self._counter), request.routing)
        health = self.health.get(queue)
        if health is not None and health.down_until:
            health.probing = True
        self.loads[queue] = self.loads.get(queue, 0) + 1
        self.in_flight[request.request_id] = (queue, now)
        _remember(self.homes, request.trajectory_id, queue)
        if request.group_id not in self.group_homes:
            _remember(self.group_homes, request.group_id, queue)
        fallback = chosen_pool != primary
        if fallback:
            key = f"{primary}->{chosen_pool}"
            self.fallbacks[key] = self.fallbacks.get(key, 0) + 1
        replica = next(c.replica for c in candidates if c.queue == queue)
        return RouteDecision(queue=queue, pool=chosen_pool, replica=replica, fallback=fallback,
                             reason=reason)

    def _candidates(self, pool: str, replicas: int) -> list[Candidate]:
        queues = [replica_queue("gen", pool, k) for k in range(replicas)]
        return [Candidate(q, self.loads.get(q, 0), k) for k, q in enumerate(queues)]

    def release(self, request_id: str, outcome: RouteOutcome, now: float,
                down_s: float = 10.0) -> None:
        """End a routed request; a replica that did not answer is marked down for `down_s`,
        one that served it or answered a ping is healthy again."""
        entry = self.in_flight.pop(request_id, None)
        if entry is None:
            return
        queue = entry[0]
        self.loads[queue] = max(self.loads.get(queue, 0) - 1, 0)
        health = self.health.setdefault(queue, _Health())
        if outcome == "unreachable":
            health.down_until, health.probing = now + down_s, False
        elif outcome in ("ok", "busy"):
            health.down_until, health.probing = 0.0, False
        elif health.probing:
            health.probing = False

    def _expire(self, now: float) -> None:
        """Forget requests never released (oldest first: the dict keeps routing order)."""
        for request_id, (_, started) in list(self.in_flight.items()):
            if now - started <= self.in_flight_expiry_s:
                break
            self.release(request_id, "failed", now)


def _remember(table: OrderedDict[str, str], key: str, value: str) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > MAX_REMEMBERED:
        table.popitem(last=False)
