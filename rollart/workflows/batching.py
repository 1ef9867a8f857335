"""Forming a GRPO batch from finished trajectories: pure logic, unit-tested without a server."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from rollart.contracts import TrajectoryResult

MIN_GROUP = 2


@dataclass
class Batch:
    trainable: list[TrajectoryResult] = field(default_factory=list)
    evicted: list[TrajectoryResult] = field(default_factory=list)
    failed: list[TrajectoryResult] = field(default_factory=list)


def form_batch(results: list[TrajectoryResult]) -> Batch:
    """Completed trajectories train in groups of at least two (an advantage needs siblings);
    completed ones left alone in a group whose siblings failed are evicted."""
    batch = Batch()
    groups: dict[str, list[TrajectoryResult]] = defaultdict(list)
    for result in results:
        if result.status == "failed":
            batch.failed.append(result)
        else:
            groups[result.group_id].append(result)
    for members in groups.values():
        (batch.trainable if len(members) >= MIN_GROUP else batch.evicted).extend(members)
    return batch
