from rollart.contracts import TrajectoryResult
from rollart.workflows.batching import form_batch


def result(tid: str, group: str, status: str = "completed") -> TrajectoryResult:
    return TrajectoryResult(trajectory_id=tid, group_id=group, status=status)


def test_groups_stay_whole_and_every_trajectory_lands_in_one_bucket():
    results = [result("a", "g1"), result("b", "g1"), result("c", "g1", "failed"),
               result("d", "g2"), result("e", "g2", "failed"),
               result("f", "g3", "failed"), result("g", "g3", "failed")]
    batch = form_batch(results)
    assert {r.trajectory_id for r in batch.trainable} == {"a", "b"}
    assert {r.trajectory_id for r in batch.evicted} == {"d"}
    assert {r.trajectory_id for r in batch.failed} == {"c", "e", "f", "g"}
    assert len(batch.trainable) + len(batch.evicted) + len(batch.failed) == len(results)
