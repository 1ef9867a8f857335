"""Generation activities, served by one replica's vLLM engine.

A turn appends the new observation's tokens to the trajectory's context, samples, and writes the
turn to the store (ids, behaviour logprobs, the policy version). The replica keeps the context of
the trajectories it served last, so a turn that stays on its replica reads nothing and writes only
its own tokens; a turn that moved here reads the earlier turns by key. Only the decoded text goes
back into the workflow history. Decoding is constrained to the env's single-token actions, or to
its answer alphabet (plus end of sequence) for free-text answers.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import OrderedDict

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollart.activities.heartbeat import heartbeating
from rollart.contracts import (
    CONTEXT_FULL,
    Activity,
    GenerateBatch,
    GenerateBatchResult,
    GenerateRequest,
    GenerateResult,
    ReplicaMetrics,
    UpdateWeightsRequest,
    UpdateWeightsResult,
)
from rollart.metrics import (
    ACCEPTED_TOKENS,
    CACHED_TOKENS,
    DRAFT_TOKENS,
    GENERATE_SECONDS,
    GENERATED_TOKENS,
    PROMPT_TOKENS,
    WEIGHT_SECONDS,
    timed,
)
from rollart.policy.engine import PolicyEngine
from rollart.store import StoreOpener, TurnRecord
from rollart.weights import Puller, PullStats

TRACER = trace.get_tracer("rollart")


class ReplicaMeter:
    """What one replica did since the last weight update (its metrics travel with the update's
    result)."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.reset()

    def reset(self) -> ReplicaMetrics:
        previous = getattr(self, "metrics", None)
        now = time.monotonic()
        if previous is not None:
            previous.seconds = now - self.since
            previous.in_flight_mean = self._in_flight_sum / max(previous.requests, 1)
        self.metrics, self.since, self._in_flight_sum = ReplicaMetrics(), now, 0
        return previous or ReplicaMetrics()

    def arrived(self, in_flight: int) -> None:
        m = self.metrics
        m.requests += 1
        self._in_flight_sum += in_flight
        m.in_flight_max = max(m.in_flight_max, in_flight)
        m.running_max = max(m.running_max, min(in_flight, self.max_num_seqs))
        m.queue_depth_max = max(m.queue_depth_max, in_flight - self.max_num_seqs)

    def served(self, prompt_tokens: int, cached_tokens: int, generated_tokens: int) -> None:
        m = self.metrics
        m.prompt_tokens += prompt_tokens
        m.cached_tokens += cached_tokens
        m.generated_tokens += generated_tokens


class ContextCache:
    """The contexts (token ids) of the trajectories this replica served last, bounded in tokens,
    least recently used first out. An entry is valid for exactly one next turn: the one that
    follows the request that produced it, so a turn served meanwhile elsewhere (a re-route, a
    retry on another replica, a re-run) never sees a stale context."""

    def __init__(self, max_tokens: int = 1 << 23) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._entries: OrderedDict[str, tuple[str, array]] = OrderedDict()

    def get(self, trajectory_id: str, after: str | None) -> list[int] | None:
        entry = self._entries.get(trajectory_id)
        if entry is None or after is None or entry[0] != after:
            return None
        self._entries.move_to_end(trajectory_id)
        return entry[1].tolist()

    def put(self, trajectory_id: str, request_id: str, ids: list[int]) -> None:
        self.drop(trajectory_id)
        self._entries[trajectory_id] = (request_id, array("i", ids))
        self.tokens += len(ids)
        while self.tokens > self.max_tokens and self._entries:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.tokens -= len(evicted)

    def drop(self, trajectory_id: str) -> None:
        entry = self._entries.pop(trajectory_id, None)
        if entry is not None:
            self.tokens -= len(entry[1])

    def __len__(self) -> int:
        return len(self._entries)


class GenerateActivities:
    def __init__(self, engine: PolicyEngine, puller: Puller, replica: str = "",
                 stores: StoreOpener | None = None, contexts: ContextCache | None = None,
                 ) -> None:
        self.engine, self.puller, self.replica = engine, puller, replica
        self.stores = stores or StoreOpener()
        self.contexts = contexts or ContextCache()
        self.meter = ReplicaMeter(engine.config.max_num_seqs)
        self._speculation_seen: dict[str, int] = {}

    @activity.defn(name=Activity.GEN_GENERATE)
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Heartbeats from start to end: a store read or write waiting for a thread, or a
        request waiting for an engine slot, is busy, not dead."""
        return await heartbeating(self._serve(request))

    @activity.defn(name=Activity.GEN_GENERATE_BATCH)
    async def generate_batch(self, batch: GenerateBatch) -> GenerateBatchResult:
        """A lockstep batch's turn on this replica: every request reaches the engine at once,
        as separate activities' would, but the server dispatches one activity instead of one
        per trajectory. One failed request fails the batch (the workflow then sends each
        on its own)."""
        results = await heartbeating(asyncio.gather(*(self._serve(r) for r in batch.requests)))
        return GenerateBatchResult(results=list(results))

    async def _serve(self, request: GenerateRequest) -> GenerateResult:
        with TRACER.start_as_current_span("rollart.generate", attributes={
                "rollart.trajectory_id": request.trajectory_id, "rollart.turn": request.turn,
                "rollart.replica": self.replica}) as span:
            labels = {"replica": self.replica}
            with timed(GENERATE_SECONDS, labels):
                result = await self._generate(request)
            GENERATED_TOKENS.add(result.new_tokens, labels)
            PROMPT_TOKENS.add(result.prompt_tokens, labels)
            CACHED_TOKENS.add(result.cached_tokens, labels)
            span.set_attributes({"rollart.prompt_tokens": result.prompt_tokens,
                                 "rollart.new_tokens": result.new_tokens,
                                 "rollart.cached_tokens": result.cached_tokens,
                                 "rollart.version": result.version})
            return result

    async def _generate(self, request: GenerateRequest) -> GenerateResult:
        engine, sampling = self.engine, request.sampling
        tid = request.trajectory_id
        store = self.stores(request.store_dir)
        observation_ids = engine.encode(request.observation)
        context = self.contexts.get(tid, request.after) if request.turn else []
        if context is None:
            context = await asyncio.to_thread(store.context_ids, tid, request.turn)
        context += observation_ids
        allowed, max_tokens = None, sampling.max_tokens_per_turn
        if sampling.constrain_to_actions and request.action_vocabulary:
            allowed, max_tokens = engine.single_token_ids(request.action_vocabulary), 1
        elif sampling.constrain_to_actions and request.answer_alphabet:
            allowed = engine.single_token_ids(request.answer_alphabet)
            if request.answer_length:
                max_tokens = request.answer_length
            else:
                allowed.append(engine.eos_token_id)
        if len(context) + max_tokens > engine.config.max_model_len:
            self.contexts.drop(tid)
            return GenerateResult(text="", prompt_tokens=len(context), new_tokens=0,
                                  cached_tokens=0, finish_reason=CONTEXT_FULL,
                                  version=engine.version, replica=self.replica,
                                  request_id=request.request_id)
        request_id = request.request_id or f"{tid}.{request.turn}.{activity.info().attempt}"
        self.meter.arrived(engine.running_requests + 1)
        sample = await engine.generate(
            context, max_tokens=max_tokens, temperature=sampling.temperature,
            allowed_token_ids=allowed, request_id=request_id)
        self.meter.served(len(context), sample.cached_tokens, len(sample.token_ids))
        await asyncio.to_thread(store.write_turn, tid, TurnRecord(
            turn=request.turn, observation_ids=observation_ids, sampled_ids=sample.token_ids,
            logprobs=sample.logprobs, versions=sample.versions, allowed_ids=allowed,
        ))
        self.contexts.put(tid, request_id, context + sample.token_ids)
        return GenerateResult(
            text=engine.decode(sample.token_ids), prompt_tokens=len(context),
            new_tokens=len(sample.token_ids), cached_tokens=sample.cached_tokens,
            finish_reason=sample.finish_reason, version=sample.version,
            mixed_versions=len(set(sample.versions)) > 1, replica=self.replica,
            request_id=request_id, prefill_s=round(sample.prefill_s, 6),
            decode_s=round(sample.decode_s, 6),
        )

    @activity.defn(name=Activity.GEN_PING)
    async def ping(self) -> str:
        """Answered on the replica's admin queue, whatever its generate slots are doing."""
        return self.replica

    @activity.defn(name=Activity.GEN_UPDATE_WEIGHTS)
    async def update_weights(self, request: UpdateWeightsRequest) -> UpdateWeightsResult:
        """Pull the version while this replica keeps generating with the old one, then suspend
        only to load it."""
        attributes = {"rollart.version": request.version, "rollart.replica": self.replica}
        with TRACER.start_as_current_span("rollart.weights.pull", attributes=attributes):
            pulled = await heartbeating(self._pull(request.weights_prefix, request.version))
        if pulled is None:
            raise ApplicationError(f"weights v{request.version} are not published under "
                                   f"{request.weights_prefix}", type="WeightsMissing")
        _, blobs, pull = pulled
        metrics = self.meter.reset()
        await self._count_speculation(metrics)
        with TRACER.start_as_current_span("rollart.weights.load", attributes=attributes):
            seconds = await heartbeating(self.engine.update_weights(request.version, blobs))
        WEIGHT_SECONDS.record(pull.seconds, {"op": "pull", "replica": self.replica})
        WEIGHT_SECONDS.record(seconds, {"op": "load", "replica": self.replica})
        return UpdateWeightsResult(version=request.version, seconds=seconds, pull_s=pull.seconds,
                                   bytes=pull.bytes, from_durable=pull.from_durable,
                                   replica=self.replica, metrics=metrics)

    async def _count_speculation(self, metrics: ReplicaMetrics) -> None:
        """What speculation did since the last weight update (the engine counts since start)."""
        counters = await self.engine.speculation_counters()
        if counters is None:
            return
        seen, self._speculation_seen = self._speculation_seen, counters
        metrics.draft_tokens = counters["draft_tokens"] - seen.get("draft_tokens", 0)
        metrics.accepted_tokens = counters["accepted_tokens"] - seen.get("accepted_tokens", 0)
        metrics.verify_steps = counters["verify_steps"] - seen.get("verify_steps", 0)
        metrics.speculation_switches = counters["switches"] - seen.get("switches", 0)
        metrics.speculating = bool(counters["on"])
        DRAFT_TOKENS.add(metrics.draft_tokens, {"replica": self.replica})
        ACCEPTED_TOKENS.add(metrics.accepted_tokens, {"replica": self.replica})

    async def catch_up(self, weights_prefix: str) -> int:
        """Load the newest published version, if any: a replica that starts mid-run must not
        serve the base model. Returns the version now loaded."""
        pulled = await self._pull(weights_prefix)
        if pulled is not None and pulled[0] > self.engine.version:
            await self.engine.update_weights(pulled[0], pulled[1])
        return self.engine.version

    async def _pull(self, prefix: str, version: int | None = None,
                    ) -> tuple[int, list[bytes], PullStats] | None:
        """Version `version` (default: the newest) from the weight store, off the event loop so
        generation goes on meanwhile; None if it is not published."""
        manifest = await asyncio.to_thread(self.puller.manifest, prefix, version)
        if manifest is None:
            return None
        blobs, stats = await asyncio.to_thread(self.puller.pull, manifest)
        return manifest.version, blobs, stats
