"""Rewards from an HTTP endpoint: a real server on loopback, the reward activity, and a whole
trajectory scored through it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import make_config
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from rollart.activities.reward import compute_reward
from rollart.config import RewardConfig
from rollart.contracts import RewardRequest, TrajectoryResult, TrajectorySpec
from rollart.servers import free_port
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.trajectory import TrajectoryWorkflow

ANSWERS = {"/ok": (200, {"reward": 1.5, "success": True}),
           "/malformed": (200, {"score": 1}),
           "/busy": (503, {"error": "try later"}),
           "/refuses": (400, {"error": "bad request"})}


class RewardServer(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RewardServer.seen.append((self.path, dict(self.headers), body))
        status, answer = ANSWERS[self.path]
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def reward_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), RewardServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def score(url: str, **reward) -> object:
    request = RewardRequest(trajectory_id="t-1", env_name="frozenlake", env_rewards=[0.0, 1.0],
                            final_info={"success": True, "label": "G"}, domain="frozenlake",
                            reward=RewardConfig(kind="http", url=url, **reward),
                            prompt="P F F F", actions=["Right", "Down"])
    return ActivityEnvironment().run(compute_reward, request)


def test_the_endpoint_gets_the_trajectory_and_its_answer_is_the_reward(reward_server,
                                                                       monkeypatch):
    monkeypatch.setenv("ROLLART_TEST_REWARD_KEY", "secret")
    RewardServer.seen.clear()
    result = score(reward_server + "/ok", api_key_env="ROLLART_TEST_REWARD_KEY")
    assert (result.reward, result.success) == (1.5, True)
    [(_, headers, body)] = RewardServer.seen
    assert headers["Idempotency-Key"] == "t-1" and headers["Authorization"] == "Bearer secret"
    assert body == {"trajectory_id": "t-1", "domain": "frozenlake", "env": "frozenlake",
                    "prompt": "P F F F", "response": "Down", "actions": ["Right", "Down"],
                    "env_rewards": [0.0, 1.0], "final_info": {"success": True, "label": "G"},
                    "label": "G"}


@pytest.mark.parametrize(("path", "retryable", "words"), [
    ("/malformed", False, "expected JSON"), ("/busy", True, "HTTP 503"),
    ("/refuses", False, "HTTP 400")])
def test_a_bad_answer_is_a_clear_error_not_a_zero_reward(reward_server, path, retryable, words):
    with pytest.raises(ApplicationError) as raised:
        score(reward_server + path)
    assert f"reward endpoint {reward_server}{path}" in str(raised.value)
    assert words in str(raised.value) and raised.value.non_retryable is not retryable


def test_an_endpoint_that_is_down_is_named_and_retryable():
    url = f"http://127.0.0.1:{free_port()}/score"
    with pytest.raises(ApplicationError) as raised:
        score(url, timeout_s=2)
    assert f"reward endpoint {url} is unreachable" in str(raised.value)
    assert not raised.value.non_retryable
    with pytest.raises(ApplicationError, match="ROLLART_TEST_UNSET_KEY is not set"):
        score(url, api_key_env="ROLLART_TEST_UNSET_KEY")


def spec_scored_by(config, tid: str, url: str) -> TrajectorySpec:
    return TrajectorySpec.for_domain(config, "frozenlake", tid, "g", seed=7).model_copy(
        update={"reward": RewardConfig(kind="http", url=url)})


@pytest.mark.asyncio(loop_scope="session")
async def test_a_trajectory_is_scored_by_its_domains_endpoint(temporal_server, engine, tmp_path,
                                                              reward_server):
    config = make_config(temporal_server, tmp_path)
    RewardServer.seen.clear()
    async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
        result = await client.execute_workflow(
            TrajectoryWorkflow.run, spec_scored_by(config, "http-1", reward_server + "/ok"),
            id="http-1", task_queue=config.temporal.control_queue, result_type=TrajectoryResult)
        assert result.status == "completed" and (result.reward, result.success) == (1.5, True)
        [(_, _, body)] = RewardServer.seen
        assert body["trajectory_id"] == "http-1" and len(body["actions"]) == result.turns
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                TrajectoryWorkflow.run, spec_scored_by(config, "http-2",
                                                       reward_server + "/malformed"),
                id="http-2", task_queue=config.temporal.control_queue)
        assert "failed in reward" in str(failed.value.cause)
        assert "expected JSON" in str(failed.value.cause)
