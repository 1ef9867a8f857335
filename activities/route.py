"""The router: local activities that pick a generation replica for each turn.

They run inside the control worker that runs the trajectory workflows, so a decision costs a few
milliseconds and one history marker, and the router sees every request those workflows send. Its
state (loads, prefix homes, replicas marked down) lives in this process; a restarted control
worker starts from a clean table and relearns it from the next requests.
"""

from __future__ import annotations

import logging
import time

from temporalio import activity

from rollart.activities.routing import ReplicaTable
from rollart.contracts import Activity, ReleaseRequest, RouteDecision, RouteRequest

log = logging.getLogger("rollart.router")


class RouterActivities:
    def __init__(self, table: ReplicaTable | None = None) -> None:
        self.table = table or ReplicaTable()
        self.falling_back: set[str] = set()

    @activity.defn(name=Activity.GEN_ROUTE)
    async def route(self, request: RouteRequest) -> RouteDecision:
        decision = self.table.route(request, time.monotonic())
        primary = request.pools[0][0]
        if decision.fallback and primary not in self.falling_back:
            self.falling_back.add(primary)
            log.warning("gen pool %r has no live replica: routing to fallback pool %r",
                        primary, decision.pool)
        elif not decision.fallback and primary in self.falling_back:
            self.falling_back.discard(primary)
            log.warning("gen pool %r is back: routing to it again", primary)
        return decision

    @activity.defn(name=Activity.GEN_RELEASE)
    async def release(self, request: ReleaseRequest) -> None:
        self.table.release(request.request_id, request.outcome, time.monotonic(),
                           request.down_s)
        if request.outcome == "unreachable":
            log.warning("replica of request %s did not pick it up: marked down for %.0f s",
                        request.request_id, request.down_s)
