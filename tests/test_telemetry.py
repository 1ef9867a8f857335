"""OpenTelemetry traces: one trace from the client that starts a trajectory through its
workflow to each activity, and rollart's own spans inside the activities."""

from __future__ import annotations

import json

import pytest
from conftest import make_config

from rollart.contracts import TrajectoryResult, TrajectorySpec
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.trajectory import TrajectoryWorkflow


@pytest.mark.asyncio(loop_scope="session")
async def test_a_trajectory_is_one_trace_down_to_rollarts_own_spans(temporal_server, engine,
                                                                    tmp_path):
    traces = tmp_path / "traces.jsonl"
    config = make_config(temporal_server, tmp_path, **{
        "telemetry.traces": "file", "telemetry.traces_file": str(traces)})
    spec = TrajectorySpec.for_domain(config, "frozenlake", "traced-1", "g", seed=3)
    async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
        result = await client.execute_workflow(
            TrajectoryWorkflow.run, spec, id="traced-1",
            task_queue=config.temporal.control_queue, result_type=TrajectoryResult)
    spans = [json.loads(line) for line in traces.read_text().splitlines()]
    by_id = {span["context"]["span_id"]: span for span in spans}
    names = [span["name"] for span in spans]
    started = next(s for s in spans if s["name"] == "StartWorkflow:TrajectoryWorkflow")
    assert {s["context"]["trace_id"] for s in spans} == {started["context"]["trace_id"]}
    for ours, activity in (("rollart.env.reset", "env.reset"), ("rollart.generate",
                                                                "gen.generate"),
                           ("rollart.env.step", "env.step"), ("rollart.reward",
                                                              "reward.compute")):
        span = next(s for s in spans if s["name"] == ours)
        assert by_id[span["parent_id"]]["name"] == f"RunActivity:{activity}"
    generates = [s for s in spans if s["name"] == "rollart.generate"]
    assert len(generates) == result.turns == names.count("rollart.env.step")
    assert {s["attributes"]["rollart.turn"] for s in generates} == set(range(result.turns))
    assert all(s["attributes"]["rollart.trajectory_id"] == "traced-1" for s in generates)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_training_run_traces_its_iterations_train_steps_and_weights(
        temporal_server, engine, tmp_path):
    from rollart.contracts import TrainingStatus
    from rollart.workflows.training import TrainingInput, TrainingWorkflow

    traces = tmp_path / "traces.jsonl"
    config = make_config(temporal_server, tmp_path, **{
        "telemetry.traces": "file", "telemetry.traces_file": str(traces),
        "algorithm.mode": "sync", "algorithm.group_size": 2, "algorithm.batch_size": 4,
        "algorithm.iterations": 2, "algorithm.minibatches": 1})
    async with in_process_fleet(config, engine) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="traced-run",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
    spans = [json.loads(line) for line in traces.read_text().splitlines()]
    named = {}
    for span in spans:
        named.setdefault(span["name"], []).append(span)
    iterations = named["rollart.iteration"]
    assert [s["attributes"]["rollart.iteration"] for s in iterations] == [0, 1]
    assert iterations[-1]["attributes"]["rollart.version"] == status.version == 2
    assert len(named["rollart.train_step"]) == 2
    assert len(named["rollart.weights.publish"]) == 3  # version 0, then one per step
    assert len(named["rollart.weights.load"]) >= 2 and "rollart.weights.pull" in named
    run = named["StartWorkflow:TrainingWorkflow"][0]["context"]["trace_id"]
    assert {s["context"]["trace_id"] for s in named["RunWorkflow:TrajectoryWorkflow"]} == {run}
