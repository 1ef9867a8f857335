"""The sample buffer: GRPO groups from start to training, under the staleness bound alpha.

Pure, deterministic logic driven by TrainingWorkflow and tested directly. It owns the ledger:
every trajectory it is told about ends in exactly one bucket (trained, failed, evicted), and is
in flight until then (running, or finished and waiting in the buffer), so
started = trained + failed + evicted + in flight always holds.

The rule: a trajectory started when the rollout policy was version v0 may be trained on at
version n only while n - v0 <= alpha. A group is as old as its oldest member.

Which groups form a batch matters as much. Taking whichever groups finish first favours short
episodes: in FrozenLake the successful ones are the long ones, so their groups finish last, age
past alpha and are evicted (measured: 30% of trajectories evicted and no learning in 25
iterations with alpha 1). So by default a batch is the oldest groups in start order
("fifo"): membership is fixed when a group starts, not by how fast it ends.

A failed trajectory can be re-run by hand (`rollart replay`, or `temporal workflow reset`). Its
new result re-enters its group while the group is still waiting in the buffer, which is only
ever the case while it is admissible (the failure moves back from failed to in flight). After its
group was trained, evicted or given up, the result is late: counted, and never trained.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rollart.contracts import Ledger, TrajectoryResult

MIN_GROUP = 2


def admissible(start_version: int, version: int, alpha: int) -> bool:
    return version - start_version <= alpha


def groups_to_start(mode: str, alpha: int, per_batch: int, outstanding: int,
                    training: bool) -> int:
    """How many groups the supply may start now. Batches are consumed in start order, one per
    version, so a group started with B batches ahead of it is trained B versions later, and one
    started while the trainer trains sees one version more: keeping at most
    per_batch * (alpha + 1) groups outstanding, one batch fewer while training, means nothing
    started is doomed to go stale. sync and one_off start whole batches, and replace groups that
    failed out of a batch (else that batch could never fill). one_off generates one batch at a
    time, the next while the previous one trains (RollArt's and verl's one-off baseline): with
    the trainer idle, a second batch would make it async in whole batches."""
    if mode == "one_off":
        room = per_batch - outstanding
    else:
        room = per_batch * (alpha + 1 - (1 if training else 0)) - outstanding
    if mode == "async" or room <= 0:
        return max(room, 0)
    return per_batch if room >= per_batch else min(room, -outstanding % per_batch)


def next_domain(weights: dict[str, float], started: dict[str, int]) -> str:
    """The domain of the next group: the one furthest behind its share of the groups started so
    far (ties to the first). Random draws left a 64-trajectory batch of two equal domains with 0
    to 8 groups of either (measured: arithmetic's batch success swung from 0 to 1.0); this keeps
    every batch within one group of its shares."""
    total, after = sum(weights.values()), sum(started.values()) + 1
    return max(weights, key=lambda name: weights[name] / total * after - started.get(name, 0))


SIGNAL_WINDOW = 16


class DomainMix(BaseModel):
    """Domain shares that follow where the learning signal is (`domain_sampling = "signal"`):
    a group whose members all scored the same teaches nothing, so a domain the policy solved (or
    cannot yet score on) gives its share of new groups to those whose groups still differ.
    Measured on examples/multitask.toml: once FrozenLake was solved, its half of every batch
    carried no signal while arithmetic learned per episode exactly as it does alone, only on
    half the episodes. A domain keeps `floor` of its weight, so a regression is still seen."""

    recent: dict[str, list[bool]] = Field(default_factory=dict, description="Domain -> whether "
                                          f"each of its last {SIGNAL_WINDOW} trained groups "
                                          "carried a signal.")
    credit: dict[str, float] = Field(default_factory=dict)

    def observe(self, domain: str, rewards: list[float]) -> None:
        signal = len(set(rewards)) > 1
        self.recent[domain] = (self.recent.get(domain, []) + [signal])[-SIGNAL_WINDOW:]

    def shares(self, weights: dict[str, float], floor: float) -> dict[str, float]:
        """Each domain's share of new groups: its weight times its recent signal share (1 until
        a group of it was trained), at least `floor` of its weight; summing to 1."""
        raw = {}
        for name, weight in weights.items():
            seen = self.recent.get(name)
            signal = sum(seen) / len(seen) if seen else 1.0
            raw[name] = weight * max(signal, floor)
        total = sum(raw.values())
        return {name: value / total for name, value in raw.items()}

    def next_domain(self, weights: dict[str, float], floor: float) -> str:
        """Smooth weighted round robin over the current shares: every group adds each domain's
        share to its credit and goes to the most credited (ties to the first), so any run of
        groups is within one group of the shares even as they move."""
        for name, share in self.shares(weights, floor).items():
            self.credit[name] = self.credit.get(name, 0.0) + share
        chosen = max(weights, key=lambda name: self.credit[name])
        self.credit[chosen] -= 1.0
        return chosen


class Group(BaseModel):
    group_id: str
    order: int = Field(description="Start order across the run.")
    start_version: int
    target: int = Field(description="Members needed to form the group (group_size).")
    in_flight: list[str] = Field(default_factory=list)
    completed: list[TrajectoryResult] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list, description="Members that failed.")

    @property
    def complete(self) -> bool:
        """Enough members finished, or none is left running and at least two finished."""
        if len(self.completed) >= self.target:
            return True
        return not self.in_flight and len(self.completed) >= MIN_GROUP

    @property
    def hopeless(self) -> bool:
        return not self.in_flight and len(self.completed) < MIN_GROUP


class Decision(BaseModel):
    """What the workflow must do after the buffer changed."""

    cancel: list[str] = Field(default_factory=list)
    evicted: list[TrajectoryResult] = Field(default_factory=list)


class SampleBuffer(BaseModel):
    alpha: int
    batch_order: Literal["fifo", "first_complete"] = "fifo"
    groups: dict[str, Group] = Field(default_factory=dict)
    started_groups: int = 0
    ledger: Ledger = Field(default_factory=Ledger)
    late_results: int = Field(0, description="Results of trajectories already settled.")
    readmitted: list[str] = Field(default_factory=list, description="Failed trajectories "
                                  "whose re-run re-entered (each at most once).")
    stale_evicted: int = 0

    def start_group(self, group_id: str, trajectory_ids: list[str], start_version: int,
                    target: int) -> None:
        self.groups[group_id] = Group(group_id=group_id, order=self.started_groups,
                                      start_version=start_version, target=target,
                                      in_flight=list(trajectory_ids))
        self.started_groups += 1
        self.ledger.started += len(trajectory_ids)

    def owner(self, trajectory_id: str) -> Group | None:
        for group in self.groups.values():
            if trajectory_id in group.in_flight:
                return group
        return None

    def record(self, result: TrajectoryResult) -> Decision:
        """A trajectory ended. A completed re-run of a failed member re-enters its group if the
        group still waits; other results for settled ids (a cancelled one that finished anyway, a
        duplicate signal, a re-run too late) are counted late and change nothing else."""
        tid = result.trajectory_id
        group = self.owner(tid)
        decision = Decision()
        if group is not None:
            group.in_flight.remove(tid)
            if result.status != "completed":
                group.failed.append(tid)
                self.ledger.failed += 1
        else:
            group = self._failed_owner(tid) if result.status == "completed" else None
            if group is None:
                self.late_results += 1
                return decision
            group.failed.remove(tid)
            self.ledger.failed -= 1
            self.readmitted.append(tid)
        if result.status == "completed":
            group.completed.append(result)
            if len(group.completed) >= group.target and group.in_flight:
                decision.cancel = list(group.in_flight)  # redundant siblings
                self.ledger.evicted += len(group.in_flight)
                group.in_flight = []
        if group.hopeless:
            decision.evicted += group.completed
            self.ledger.evicted += len(group.completed)
            del self.groups[group.group_id]
        return decision

    def _failed_owner(self, trajectory_id: str) -> Group | None:
        """The waiting group that lost this member and still needs it."""
        for group in self.groups.values():
            if trajectory_id in group.failed and len(group.completed) < group.target:
                return group
        return None

    def next_batch(self, count: int, version: int) -> list[Group]:
        """The `count` groups the trainer would get now, or [] if they are not all ready:
        fifo, the oldest groups by start order once all of them are complete; first_complete,
        any complete groups, oldest first."""
        live = sorted((g for g in self.groups.values()
                       if admissible(g.start_version, version, self.alpha)),
                      key=lambda g: g.order)
        if self.batch_order == "fifo":
            batch = live[:count]
            return batch if len(batch) == count and all(g.complete for g in batch) else []
        ready = [g for g in live if g.complete][:count]
        return ready if len(ready) == count else []

    def ready_groups(self, count: int, version: int) -> list[Group]:
        """Up to `count` complete admissible groups, oldest first: what a streaming batch
        takes when its deadline passes."""
        return sorted((g for g in self.groups.values()
                       if g.complete and admissible(g.start_version, version, self.alpha)),
                      key=lambda g: g.order)[:count]

    def take(self, count: int, version: int, partial: bool = False) -> list[Group]:
        """Hand `count` groups to the trainer (all of them trained) or none if not ready;
        `partial`: whatever complete admissible groups there are, up to `count`."""
        taken = (self.ready_groups(count, version) if partial
                 else self.next_batch(count, version))
        for group in taken:
            del self.groups[group.group_id]
            self.ledger.trained += len(group.completed)
        return taken

    def evict_stale(self, version: int) -> Decision:
        """After the version advanced: drop every group that may no longer be trained on,
        cancelling its members still running."""
        decision = Decision()
        for group in list(self.groups.values()):
            if admissible(group.start_version, version, self.alpha):
                continue
            decision.cancel += group.in_flight
            decision.evicted += group.completed
            count = len(group.in_flight) + len(group.completed)
            self.ledger.evicted += count
            self.stale_evicted += count
            del self.groups[group.group_id]
        return decision

    def evict_all(self) -> Decision:
        """The run is over: nothing left may be trained."""
        decision = Decision()
        for group in self.groups.values():
            decision.cancel += group.in_flight
            decision.evicted += group.completed
            self.ledger.evicted += len(group.in_flight) + len(group.completed)
        self.groups = {}
        return decision

    @property
    def in_flight(self) -> int:
        """Trajectories still running."""
        return sum(len(g.in_flight) for g in self.groups.values())

    @property
    def buffered(self) -> int:
        """Finished trajectories waiting for their group to be trained."""
        return sum(len(g.completed) for g in self.groups.values())

    def outstanding_groups(self) -> int:
        return len(self.groups)
