"""Reward kinds that score elsewhere: an HTTP endpoint, a submit-then-poll HTTP job, an AWS
Lambda function. All send the same JSON body (`request_body`) and read the same answer
({"reward": number, "success": bool}); all raise the same errors: a retryable
RewardEndpointDown when the endpoint cannot be reached, times out or is overloaded (the
workflow retries with backoff, then fails the trajectory naming the endpoint), and a final
MalformedReward or RewardEndpointError for answers that no retry would change."""

from __future__ import annotations

import json
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request

from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollart.activities.heartbeat import record_progress
from rollart.contracts import RewardRequest, RewardResult

_LOCK = threading.Lock()  # the caches below are filled by the reward threads
_TLS: dict[str | None, ssl.SSLContext] = {}
_CLIENTS: dict[tuple[str, str | None, float], object] = {}


def request_body(request: RewardRequest) -> dict[str, object]:
    return {
        "trajectory_id": request.trajectory_id, "domain": request.domain,
        "env": request.env_name, "prompt": request.prompt,
        "response": request.actions[-1] if request.actions else "", "actions": request.actions,
        "env_rewards": request.env_rewards, "final_info": request.final_info,
        "label": request.final_info.get("label"),
    }


def http_reward(request: RewardRequest) -> RewardResult:
    """One POST, answered with the reward."""
    url = request.reward.url
    return parse_answer(url, _http(request, "POST", url, json.dumps(request_body(request))))


def http_poll_reward(request: RewardRequest) -> RewardResult:
    """POST submits a job (answer {"job_id": ...}, or the reward at once); GET url/<job_id>
    polls it until it answers with the reward. The job id is heartbeated, so an attempt retried
    after its worker died polls the same job instead of submitting another."""
    cfg, url = request.reward, request.reward.url
    resumed = activity.info().heartbeat_details if activity.in_activity() else []
    if resumed:
        job = str(resumed[0])
    else:
        answer = _json(url, _http(request, "POST", url, json.dumps(request_body(request))))
        if "reward" in answer:
            return parse_answer(url, json.dumps(answer).encode())
        job = answer.get("job_id")
        if not isinstance(job, str | int) or isinstance(job, bool):
            raise _malformed(url, json.dumps(answer).encode(), 'expected {"job_id": ...} or '
                             "the reward")
        job = str(job)
    record_progress(job)
    job_url = f"{url.rstrip('/')}/{urllib.request.quote(job, safe='')}"
    deadline = time.monotonic() + cfg.deadline_s
    while True:
        payload = _http(request, "GET", job_url, None)
        if payload is not None:
            answer = _json(job_url, payload)
            if answer.get("status") not in ("pending", "running"):
                return parse_answer(job_url, payload)
        if time.monotonic() > deadline:
            raise ApplicationError(f"reward job {job_url} still pending after {cfg.deadline_s} s",
                                   type="RewardJobTimedOut", non_retryable=True)
        time.sleep(cfg.poll_interval_s)
        record_progress(job)


def _http(request: RewardRequest, method: str, url: str, body: str | None) -> bytes | None:
    """The answer's body; None for 202 Accepted (a job still running)."""
    cfg = request.reward
    headers = {"Content-Type": "application/json", "Idempotency-Key": request.trajectory_id}
    if cfg.api_key_env:
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise ApplicationError(f"reward.api_key_env: {cfg.api_key_env} is not set on the "
                                   "reward worker", type="RewardConfigError", non_retryable=True)
        headers["Authorization"] = f"Bearer {key}"
    call = urllib.request.Request(url, data=body.encode() if body is not None else None,
                                  headers=headers, method=method)
    try:
        with urllib.request.urlopen(call, timeout=cfg.timeout_s,
                                    context=_tls_context(cfg.ca_file)) as response:
            return None if response.status == 202 else response.read()
    except urllib.error.HTTPError as err:
        retryable = err.code == 429 or err.code >= 500
        raise ApplicationError(
            f"reward endpoint {url} answered HTTP {err.code}: {err.read()[:200]!r}",
            type="RewardEndpointDown" if retryable else "RewardEndpointError",
            non_retryable=not retryable) from None
    except (urllib.error.URLError, OSError) as err:  # refused, unresolvable, timed out
        reason = getattr(err, "reason", err)
        if isinstance(reason, ssl.SSLCertVerificationError):  # no retry would change it
            raise ApplicationError(
                f"reward endpoint {url}: its TLS certificate did not verify "
                f"({reason.verify_message}); trust its CA with reward.ca_file",
                type="RewardEndpointError", non_retryable=True) from None
        raise ApplicationError(f"reward endpoint {url} is unreachable: {reason}",
                               type="RewardEndpointDown") from None


def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Verifying contexts, one per CA bundle (loading one costs milliseconds)."""
    with _LOCK:
        if ca_file not in _TLS:
            _TLS[ca_file] = ssl.create_default_context(cafile=ca_file)
        return _TLS[ca_file]


def lambda_reward(request: RewardRequest) -> RewardResult:
    """A synchronous Invoke with the body as the event. Throttling (429), service errors and
    an unreachable endpoint are retried by the workflow; a function that raised is final."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    cfg = request.reward
    where = f"lambda function {cfg.function}" + (f" at {cfg.endpoint_url}"
                                                 if cfg.endpoint_url else f" in {cfg.region}")
    try:
        response = _lambda_client(cfg.region, cfg.endpoint_url, cfg.timeout_s).invoke(
            FunctionName=cfg.function, InvocationType="RequestResponse",
            Payload=json.dumps(request_body(request)).encode())
        payload = response["Payload"].read()
    except NoCredentialsError:
        raise ApplicationError(f"{where}: no AWS credentials on the reward worker",
                               type="RewardConfigError", non_retryable=True) from None
    except ClientError as err:
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = err.response.get("Error", {}).get("Code", "")
        retryable = status == 429 or status >= 500
        raise ApplicationError(f"{where} refused the call: {code} (HTTP {status}): {err}",
                               type="RewardEndpointDown" if retryable else "RewardEndpointError",
                               non_retryable=not retryable) from None
    except BotoCoreError as err:  # connection refused, timed out
        raise ApplicationError(f"{where} is unreachable: {err}",
                               type="RewardEndpointDown") from None
    if response.get("FunctionError"):
        raise ApplicationError(f"{where} raised: {payload[:300]!r}", type="RewardFunctionError",
                               non_retryable=True)
    return parse_answer(where, payload)


def _lambda_client(region: str, endpoint_url: str | None, timeout_s: float):
    """One client per endpoint, shared by the reward threads (clients are thread-safe;
    creating one is not, and costs tens of ms). botocore's own retries are off: the workflow's
    retry policy backs off, visibly in the history."""
    import boto3
    from botocore.config import Config

    key = (region, endpoint_url, timeout_s)
    with _LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = boto3.session.Session().client(
                "lambda", region_name=region, endpoint_url=endpoint_url,
                config=Config(retries={"total_max_attempts": 1, "mode": "standard"},
                              connect_timeout=5, read_timeout=timeout_s,
                              max_pool_connections=64))
        return _CLIENTS[key]


def _json(url: str, payload: bytes) -> dict:
    try:
        answer = json.loads(payload)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise _malformed(url, payload, "expected a JSON object")
    return answer


def parse_answer(source: str, payload: bytes) -> RewardResult:
    try:
        answer = json.loads(payload)
        reward = answer["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise TypeError("reward is not a number")
        if not math.isfinite(reward):
            raise ValueError("reward is not finite")
        success = answer.get("success", reward > 0)
        if not isinstance(success, bool):
            raise TypeError("success is not a boolean")
        remote_s = answer.get("compute_s", 0.0)
        if isinstance(remote_s, bool) or not isinstance(remote_s, int | float):
            raise TypeError("compute_s is not a number")
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise _malformed(source, payload, f'expected {{"reward": number, "success": bool}} '
                         f"({err})") from None
    return RewardResult(reward=float(reward), success=success, remote_s=float(remote_s))


def _malformed(source: str, payload: bytes, expected: str) -> ApplicationError:
    return ApplicationError(f"reward endpoint {source} answered {payload[:200]!r}: {expected}",
                            type="MalformedReward", non_retryable=True)

