"""Rewards scored elsewhere, against real servers on loopback: an HTTP endpoint, a
submit-then-poll job server, and a Lambda Invoke API running real handlers; the reward
activity on each, and whole trajectories scored through them."""

from __future__ import annotations

import dataclasses
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import make_config
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from tls_proxy import make_pki

from rollart.activities.reward import check_reward, compute_reward, register_reward_kind
from rollart.config import RewardConfig
from rollart.contracts import RewardRequest, RewardResult, TrajectoryResult, TrajectorySpec
from rollart.servers import free_port
from rollart.workers.fleet import in_process_fleet
from rollart.workers.lambda_local import LambdaLocal, load_handler
from rollart.workflows.trajectory import TrajectoryWorkflow

EXAMPLE_REWARDS = Path(__file__).parent.parent / "examples" / "rewards"
ANSWERS = {"/ok": (200, {"reward": 1.5, "success": True}),
           "/malformed": (200, {"score": 1}),
           "/busy": (503, {"error": "try later"}),
           "/refuses": (400, {"error": "bad request"}),
           "/jobs": (200, {"job_id": "job/1"}),
           "/jobs-at-once": (200, {"reward": 0.5, "success": False})}
PENDING_POLLS = 2


class RewardServer(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict, dict | None]] = []
    polls: dict[str, int] = {}

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RewardServer.seen.append(("POST", self.path, dict(self.headers), body))
        self._answer(*ANSWERS[self.path])

    def do_GET(self) -> None:  # noqa: N802
        RewardServer.seen.append(("GET", self.path, dict(self.headers), None))
        if self.path != "/jobs/job%2F1":
            self._answer(404, {"error": "no such job"})
            return
        polls = RewardServer.polls[self.path] = RewardServer.polls.get(self.path, 0) + 1
        if polls <= PENDING_POLLS:
            self._answer(202 if polls == 1 else 200, {"status": "pending"})
            return
        self._answer(200, {"reward": 2.0, "success": True, "status": "done"})

    def _answer(self, status: int, answer: dict) -> None:
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


def failing_handler(event: dict, context: object) -> dict:
    raise KeyError("no label in " + event["trajectory_id"])


@pytest.fixture(scope="module")
def lambda_server():
    verify = load_handler("arithmetic_verifier:handler", code_dir=str(EXAMPLE_REWARDS))
    server = LambdaLocal({"verify": verify, "fails": failing_handler}).start()
    yield server
    server.shutdown()


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "local"), ("AWS_SECRET_ACCESS_KEY", "local")):
        monkeypatch.setenv(name, value)


def reward_request(tid: str = "t-1", prompt: str = "P F F F",
                   actions: tuple[str, ...] = ("Right", "Down"), **reward) -> RewardRequest:
    return RewardRequest(trajectory_id=tid, env_name="frozenlake", env_rewards=[0.0, 1.0],
                         final_info={"success": True, "label": "G"}, domain="frozenlake",
                         reward=RewardConfig(**reward), prompt=prompt, actions=list(actions))


def score(url: str, kind: str = "http", **reward) -> RewardResult:
    return ActivityEnvironment().run(compute_reward, reward_request(kind=kind, url=url, **reward))


def test_the_endpoint_gets_the_trajectory_and_its_answer_is_the_reward(reward_server,
                                                                       monkeypatch):
    monkeypatch.setenv("ROLLART_TEST_REWARD_KEY", "secret")
    RewardServer.seen.clear()
    result = score(reward_server + "/ok", api_key_env="ROLLART_TEST_REWARD_KEY")
    assert (result.reward, result.success, result.kind) == (1.5, True, "http")
    assert result.compute_s > 0 and result.attempt == 1
    [(_, _, headers, body)] = RewardServer.seen
    assert headers["Idempotency-Key"] == "t-1" and headers["Authorization"] == "Bearer secret"
    assert body == {"trajectory_id": "t-1", "domain": "frozenlake", "env": "frozenlake",
                    "prompt": "P F F F", "response": "Down", "actions": ["Right", "Down"],
                    "env_rewards": [0.0, 1.0], "final_info": {"success": True, "label": "G"},
                    "label": "G"}


@pytest.mark.parametrize(("path", "retryable", "words"), [
    ("/malformed", False, 'expected {"reward": number'), ("/busy", True, "HTTP 503"),
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
    assert not raised.value.non_retryable and raised.value.type == "RewardEndpointDown"
    with pytest.raises(ApplicationError, match="ROLLART_TEST_UNSET_KEY is not set"):
        score(url, api_key_env="ROLLART_TEST_UNSET_KEY")


def test_an_https_endpoint_is_verified_and_a_private_ca_can_be_trusted(tmp_path):
    pki = make_pki(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), RewardServer)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki["server_cert"], pki["server_key"])
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}/ok"
    try:
        with pytest.raises(ApplicationError) as raised:
            score(url)
        assert f"reward endpoint {url}: its TLS certificate did not verify" in str(
            raised.value) and raised.value.non_retryable
        assert score(url, ca_file=str(pki["ca"])).reward == 1.5
    finally:
        server.shutdown()


def test_a_polled_job_is_submitted_once_and_polled_until_it_answers(reward_server):
    RewardServer.seen.clear()
    RewardServer.polls.clear()
    env = ActivityEnvironment()
    beats: list[tuple] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    result = env.run(compute_reward, reward_request(kind="http_poll", url=reward_server + "/jobs",
                                                    poll_interval_s=0.05))
    assert (result.reward, result.success, result.kind) == (2.0, True, "http_poll")
    calls = [(method, path) for method, path, _, _ in RewardServer.seen]
    assert calls == [("POST", "/jobs")] + [("GET", "/jobs/job%2F1")] * (PENDING_POLLS + 1)
    assert all(headers["Idempotency-Key"] == "t-1" for _, _, headers, _ in RewardServer.seen)
    assert beats and all(details == ("job/1",) for details in beats)

    # an attempt retried after its worker died resumes the job its heartbeats named
    RewardServer.seen.clear()
    RewardServer.polls.clear()
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_details=["job/1"], attempt=2)
    result = env.run(compute_reward, reward_request(kind="http_poll", url=reward_server + "/jobs",
                                                    poll_interval_s=0.05))
    assert result.reward == 2.0 and result.attempt == 2
    assert [m for m, _, _, _ in RewardServer.seen] == ["GET"] * (PENDING_POLLS + 1)


def test_a_polled_endpoint_may_answer_at_once_and_a_job_may_run_out_of_time(reward_server):
    result = score(reward_server + "/jobs-at-once", kind="http_poll")
    assert (result.reward, result.success) == (0.5, False)
    RewardServer.polls.clear()
    with pytest.raises(ApplicationError, match="still pending after 0.1 s") as raised:
        score(reward_server + "/jobs", kind="http_poll", poll_interval_s=0.2, deadline_s=0.1)
    assert raised.value.non_retryable


def test_lambda_runs_the_real_handler_and_its_failures_are_clear(lambda_server):
    def invoke(function: str, prompt: str = "3 7 + 4 5 =", answer: str = "8 2",
               endpoint: str | None = lambda_server.url) -> RewardResult:
        return ActivityEnvironment().run(compute_reward, reward_request(
            prompt=prompt, actions=(answer,), kind="lambda", function=function,
            endpoint_url=endpoint, timeout_s=5))

    assert invoke("verify").model_dump(include={"reward", "success", "kind"}) == {
        "reward": 1.0, "success": True, "kind": "lambda"}
    assert invoke("verify", answer="8 1").reward == 0.0
    with pytest.raises(ApplicationError) as raised:
        invoke("fails")
    assert "lambda function fails" in str(raised.value) and "KeyError" in str(raised.value)
    assert raised.value.type == "RewardFunctionError" and raised.value.non_retryable
    with pytest.raises(ApplicationError) as raised:
        invoke("verify", prompt="no sum here")
    assert "not an arithmetic prompt" in str(raised.value)
    with pytest.raises(ApplicationError) as raised:
        invoke("nosuchfunction")
    assert "ResourceNotFoundException" in str(raised.value) and raised.value.non_retryable

    lambda_server.concurrency = 0
    try:
        with pytest.raises(ApplicationError) as raised:
            invoke("verify")
    finally:
        lambda_server.concurrency = 1000
    assert "TooManyRequestsException (HTTP 429)" in str(raised.value)
    assert not raised.value.non_retryable and lambda_server.throttled == 1

    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ApplicationError) as raised:
        invoke("verify", endpoint=down)
    assert f"lambda function verify at {down} is unreachable" in str(raised.value)
    assert raised.value.type == "RewardEndpointDown" and not raised.value.non_retryable


def test_a_registered_kind_scores_and_an_unknown_one_is_refused_by_name():
    @register_reward_kind("tests.double")
    def double(request: RewardRequest) -> RewardResult:
        return RewardResult(reward=2 * sum(request.env_rewards) * request.reward.options["k"],
                            success=True)

    result = ActivityEnvironment().run(compute_reward, reward_request(kind="tests.double",
                                                                      options={"k": 3}))
    assert (result.reward, result.kind) == (6.0, "tests.double")
    for reward, words in (({"kind": "nosuch"}, "unknown reward kind 'nosuch'"),
                          ({"rule": "nosuchrule"}, "unknown reward rule 'nosuchrule'")):
        with pytest.raises(ApplicationError, match=words) as raised:
            ActivityEnvironment().run(check_reward, RewardConfig(**reward), "domains.x.reward")
        assert "domains.x.reward" in str(raised.value) and raised.value.non_retryable


def spec_scored_by(config, domain: str, tid: str, **reward) -> TrajectorySpec:
    return TrajectorySpec.for_domain(config, domain, tid, "g", seed=7).model_copy(
        update={"reward": RewardConfig(**reward)})


@pytest.mark.asyncio(loop_scope="session")
async def test_trajectories_are_scored_by_their_domains_endpoints(
        temporal_server, engine, tmp_path, reward_server, lambda_server):
    config = make_config(temporal_server, tmp_path, domains={
        "frozenlake": {}, "arithmetic": {"max_turns": 1}})
    RewardServer.seen.clear()
    RewardServer.polls.clear()
    async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
        async def run(spec: TrajectorySpec) -> TrajectoryResult:
            return await client.execute_workflow(
                TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                task_queue=config.temporal.control_queue, result_type=TrajectoryResult)

        http, polled, verified = await run(spec_scored_by(
            config, "frozenlake", "http-1", kind="http", url=reward_server + "/ok")), \
            await run(spec_scored_by(config, "frozenlake", "poll-1", kind="http_poll",
                                     url=reward_server + "/jobs", poll_interval_s=0.1)), \
            await run(spec_scored_by(config, "arithmetic", "lambda-1", kind="lambda",
                                     function="verify", endpoint_url=lambda_server.url))
        assert (http.reward, http.success, http.reward_kind) == (1.5, True, "http")
        body = next(b for m, _, _, b in RewardServer.seen if m == "POST" and b)
        assert body["trajectory_id"] == "http-1" and len(body["actions"]) == http.turns
        assert (polled.reward, polled.reward_kind) == (2.0, "http_poll")
        assert polled.reward_latency_s >= polled.reward_compute_s > 0
        assert verified.status == "completed" and verified.reward_kind == "lambda"

        with pytest.raises(WorkflowFailureError) as failed:
            await run(spec_scored_by(config, "frozenlake", "http-2", kind="http",
                                     url=reward_server + "/malformed"))
        assert "failed in reward" in str(failed.value.cause)
        assert 'expected {"reward": number' in str(failed.value.cause)
