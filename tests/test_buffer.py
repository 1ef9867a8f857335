"""The sample buffer's staleness rule and accounting, driven without a server."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.contracts import TrajectoryResult
from rollart.workflows.buffer import (
    SIGNAL_WINDOW,
    Decision,
    DomainMix,
    SampleBuffer,
    admissible,
    groups_to_start,
    next_domain,
)


def done(tid: str, group: str, status: str = "completed") -> TrajectoryResult:
    return TrajectoryResult(trajectory_id=tid, group_id=group, status=status)


def test_admissible_is_exactly_n_minus_v0_at_most_alpha():
    assert admissible(3, 4, 1) and admissible(3, 3, 0)
    assert not admissible(3, 5, 1) and not admissible(3, 4, 0)


def test_redundant_siblings_are_cancelled_once_the_group_is_formed():
    buffer = SampleBuffer(alpha=1)
    buffer.start_group("g", ["a", "b", "c"], start_version=0, target=2)
    assert buffer.record(done("a", "g")).cancel == []
    decision = buffer.record(done("b", "g"))
    assert decision.cancel == ["c"]
    assert buffer.record(done("c", "g")).cancel == []  # finished anyway: already counted
    assert buffer.late_results == 1
    [group] = buffer.take(1, version=0)
    assert [r.trajectory_id for r in group.completed] == ["a", "b"]
    assert buffer.ledger.model_dump() == {"started": 3, "trained": 2, "failed": 0, "evicted": 1}


def test_a_group_without_two_survivors_is_evicted():
    buffer = SampleBuffer(alpha=0)
    buffer.start_group("g", ["a", "b"], start_version=0, target=2)
    buffer.record(done("a", "g"))
    decision = buffer.record(done("b", "g", status="failed"))
    assert [r.trajectory_id for r in decision.evicted] == ["a"]
    assert buffer.ledger.model_dump() == {"started": 2, "trained": 0, "failed": 1, "evicted": 1}
    assert buffer.take(1, version=0) == []


def test_a_rerun_of_a_failed_member_re_enters_its_waiting_group():
    buffer = SampleBuffer(alpha=1)
    buffer.start_group("g", ["a", "b", "c"], start_version=0, target=3)
    buffer.record(done("a", "g", status="failed"))
    buffer.record(done("b", "g"))
    assert buffer.ledger.failed == 1
    buffer.record(done("a", "g"))
    assert buffer.readmitted == ["a"] and buffer.late_results == 0
    buffer.record(done("c", "g"))
    [group] = buffer.take(1, version=1)
    assert sorted(r.trajectory_id for r in group.completed) == ["a", "b", "c"]
    assert buffer.ledger.model_dump() == {"started": 3, "trained": 3, "failed": 0, "evicted": 0}


def test_a_rerun_after_its_group_left_the_buffer_is_late():
    for leave in ("trained", "stale", "full"):
        buffer = SampleBuffer(alpha=0)
        buffer.start_group("g", ["a", "b", "c", "d"], start_version=0,
                           target=2 if leave == "full" else 3)
        buffer.record(done("a", "g", status="failed"))
        for tid in ("b", "c", "d"):
            buffer.record(done(tid, "g"))
        if leave == "trained":
            buffer.take(1, version=0)
        elif leave == "stale":
            buffer.evict_stale(version=1)
        before, late = buffer.ledger.model_copy(), buffer.late_results
        buffer.record(done("a", "g"))
        assert buffer.readmitted == [] and buffer.late_results == late + 1, leave
        assert buffer.ledger == before, leave
        assert buffer.record(done("a", "g", status="failed")) == Decision()
        assert buffer.late_results == late + 2


def test_fifo_waits_for_the_oldest_group_first_complete_does_not():
    for order, expected in (("fifo", []), ("first_complete", ["young"])):
        buffer = SampleBuffer(alpha=1, batch_order=order)
        buffer.start_group("old", ["o1", "o2"], start_version=0, target=2)
        buffer.start_group("young", ["y1", "y2"], start_version=0, target=2)
        buffer.record(done("o1", "old"))
        buffer.record(done("y1", "young"))
        buffer.record(done("y2", "young"))
        assert [g.group_id for g in buffer.take(1, version=0)] == expected


@settings(max_examples=300, deadline=None)
@given(alpha=st.integers(0, 3), per_batch=st.integers(1, 3), group_size=st.integers(2, 4),
       redundancy=st.integers(0, 2), order=st.sampled_from(["fifo", "first_complete"]),
       data=st.data())
def test_no_trained_trajectory_ever_violates_alpha(alpha, per_batch, group_size, redundancy,
                                                   order, data):
    """Random env latencies are random completion orders; random failures; the trainer takes a
    batch whenever one is ready; failed trajectories are re-run by hand at random times. Nothing
    older than alpha is ever handed out, nothing is trained twice, groups stay whole and the
    ledger always adds up."""
    buffer = SampleBuffer(alpha=alpha, batch_order=order)
    version, running, started_groups = 0, {}, 0
    failed: dict[str, str] = {}
    trained: set[str] = set()
    cap = per_batch * (alpha + 1)
    for _ in range(data.draw(st.integers(20, 200))):
        action = data.draw(st.sampled_from(["start", "finish", "finish", "train", "rerun"]))
        if action == "start" and buffer.outstanding_groups() < cap:
            gid = f"g{started_groups}"
            started_groups += 1
            members = [f"{gid}.t{k}" for k in range(group_size + redundancy)]
            buffer.start_group(gid, members, version, group_size)
            running.update({tid: gid for tid in members})
        elif action == "finish" and running:
            tid = data.draw(st.sampled_from(sorted(running)))
            status = data.draw(st.sampled_from(["completed"] * 5 + ["failed"]))
            gid = running.pop(tid)
            decision = buffer.record(done(tid, gid, status))
            if status == "failed":
                failed[tid] = gid
            for cancelled in decision.cancel:
                running.pop(cancelled)
        elif action == "rerun" and failed:
            tid = data.draw(st.sampled_from(sorted(failed)))
            decision = buffer.record(done(tid, failed[tid]))
            if tid in buffer.readmitted:
                del failed[tid]
            for cancelled in decision.cancel:
                running.pop(cancelled)
        elif action == "train":
            taken = buffer.take(per_batch, version)
            for group in taken:
                assert version - group.start_version <= alpha
                assert {r.group_id for r in group.completed} == {group.group_id}
                assert 2 <= len(group.completed) <= group_size
                assert all(r.status == "completed" for r in group.completed)
                ids = {r.trajectory_id for r in group.completed}
                assert len(ids) == len(group.completed) and not ids & trained
                trained |= ids
            if taken:
                version += 1
                for cancelled in buffer.evict_stale(version).cancel:
                    running.pop(cancelled)
        ledger = buffer.ledger
        assert ledger.in_flight == buffer.in_flight + buffer.buffered
        assert ledger.in_flight >= 0
        assert buffer.in_flight == len(running)
    buffer.evict_all()
    assert buffer.ledger.in_flight == 0


def test_supply_rule_per_mode():
    # sync: a whole batch, never while training
    assert groups_to_start("sync", 0, 4, outstanding=0, training=False) == 4
    assert groups_to_start("sync", 0, 4, outstanding=0, training=True) == 0
    # one_off: one batch generating at a time, the next while the previous one trains
    assert groups_to_start("one_off", 1, 4, outstanding=0, training=False) == 4
    assert groups_to_start("one_off", 1, 4, outstanding=0, training=True) == 4
    assert groups_to_start("one_off", 1, 4, outstanding=4, training=False) == 0
    assert groups_to_start("one_off", 1, 4, outstanding=4, training=True) == 0
    # a group that failed out of a running batch is replaced, so that batch can still fill
    assert groups_to_start("sync", 0, 4, outstanding=3, training=False) == 1
    assert groups_to_start("one_off", 1, 4, outstanding=3, training=True) == 1
    # async: group by group, up to alpha + 1 batches (alpha while training)
    assert groups_to_start("async", 2, 4, outstanding=5, training=False) == 7
    assert groups_to_start("async", 2, 4, outstanding=5, training=True) == 3


@settings(max_examples=200, deadline=None)
@given(alpha=st.integers(0, 3), per_batch=st.integers(1, 3),
       mode=st.sampled_from(["sync", "one_off", "async"]), data=st.data())
def test_fifo_supply_never_starts_a_group_that_must_go_stale(alpha, per_batch, mode, data):
    """With every trajectory finishing (any order) before the trainer asks, fifo batches under
    the supply rule train everything: nothing is evicted as stale."""
    alpha = {"sync": 0, "one_off": 1}.get(mode, alpha)
    buffer = SampleBuffer(alpha=alpha, batch_order="fifo")
    count = 0
    for version in range(data.draw(st.integers(3, 15))):
        for training in (False, True):
            for _ in range(groups_to_start(mode, alpha, per_batch, buffer.outstanding_groups(),
                                           training)):
                gid = f"g{count}"
                count += 1
                buffer.start_group(gid, [f"{gid}.a", f"{gid}.b"], version, 2)
            if not training:
                for group in list(buffer.groups.values()):
                    for tid in list(group.in_flight):
                        buffer.record(done(tid, group.group_id))
                assert buffer.take(per_batch, version)
        assert buffer.evict_stale(version + 1).cancel == []
    assert buffer.stale_evicted == 0


def test_a_partial_take_is_the_ready_groups_oldest_first():
    buffer = SampleBuffer(alpha=1)
    for k in range(4):
        buffer.start_group(f"g{k}", [f"g{k}a", f"g{k}b"], start_version=0, target=2)
    for k in (1, 3):  # the oldest group (g0) is still running
        buffer.record(done(f"g{k}a", f"g{k}"))
        buffer.record(done(f"g{k}b", f"g{k}"))
    assert buffer.take(4, version=0) == []  # fifo: a full batch waits for g0
    assert [g.group_id for g in buffer.ready_groups(4, version=0)] == ["g1", "g3"]
    assert buffer.ready_groups(2, version=2) == []  # too stale
    taken = buffer.take(4, version=0, partial=True)
    assert [g.group_id for g in taken] == ["g1", "g3"]
    assert buffer.ledger.trained == 4 and sorted(buffer.groups) == ["g0", "g2"]


def test_domains_take_their_share_of_every_batch():
    weights = {"lake": 1.0, "math": 1.0, "code": 2.0}
    started: dict[str, int] = {}
    order = []
    for _ in range(40):
        name = next_domain(weights, started)
        started[name] = started.get(name, 0) + 1
        order.append(name)
    for end in range(4, 41, 4):  # every 4 groups: one lake, one math, two code
        window = order[end - 4:end]
        assert sorted(window) == ["code", "code", "lake", "math"], window
    assert next_domain({"only": 0.5}, {"only": 7}) == "only"


def test_domain_mix_follows_the_signal_and_keeps_a_floor():
    mix = DomainMix()
    weights = {"lake": 1.0, "math": 1.0}
    assert mix.shares(weights, 0.1) == {"lake": 0.5, "math": 0.5}  # nothing trained yet
    for _ in range(SIGNAL_WINDOW):
        mix.observe("lake", [1.0, 1.0, 1.0, 1.0])  # solved: every member scored the same
        mix.observe("math", [0.0, 1.0, 0.0, 0.0])
    shares = mix.shares(weights, 0.1)
    assert shares["lake"] == pytest.approx(0.1 / 1.1)
    assert shares["math"] == pytest.approx(1.0 / 1.1)
    mix.observe("lake", [0.0, 1.0, 1.0, 1.0])  # it regressed: one differing group counts
    assert mix.shares(weights, 0.1)["lake"] == pytest.approx(0.1 / 1.1)  # floor still above 1/16
    for _ in range(SIGNAL_WINDOW // 2):
        mix.observe("lake", [0.0, 1.0, 1.0, 1.0])
    assert mix.shares(weights, 0.1)["lake"] > 0.3  # the window forgets the solved groups


def test_domain_mix_draws_within_one_group_of_its_shares():
    mix = DomainMix()
    weights = {"lake": 1.0, "math": 1.0, "code": 2.0}
    order = [mix.next_domain(weights, 0.1) for _ in range(40)]
    for end in range(4, 41, 4):  # before any signal: the weights, as next_domain draws them
        assert sorted(order[end - 4:end]) == ["code", "code", "lake", "math"]
    for _ in range(SIGNAL_WINDOW):
        mix.observe("code", [1.0] * 4)
        mix.observe("lake", [0.0, 1.0, 1.0, 0.0])
        mix.observe("math", [0.0, 1.0, 1.0, 0.0])
    shares = mix.shares(weights, 0.1)
    drawn = [mix.next_domain(weights, 0.1) for _ in range(120)]
    for name, share in shares.items():
        assert abs(drawn.count(name) - share * 120) <= 1, (name, drawn.count(name), share)
