"""Every metric rollart exports, defined once: the names the dashboards query.

OpenTelemetry instruments on the process's meter provider (rollart.workers.telemetry starts it
with a Prometheus endpoint); until one is started they record nothing and cost next to nothing.
The Prometheus names are the instrument names below (counters gain `_total`; histograms their
`_bucket`, `_sum` and `_count`). Labels: `run` (the training workflow's id), `domain`, `phase`,
`outcome`, `reason`, `replica` (a generation replica's queue), `op`, `kind`. Each worker's target
carries `worker` and `role` as well (rollart.workers.telemetry), so `process_cpu_seconds_total`
and `process_resident_memory_bytes` tell the workers apart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import metrics

from rollart.contracts import IterationMetrics, Ledger

SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
           60.0, 120.0, 300.0, 900.0]
VERSIONS = [0, 1, 2, 3, 4, 6, 8, 16, 32]

_meter = metrics.get_meter("rollart")


def _seconds(name: str, description: str):
    return _meter.create_histogram(name, unit="s", description=description,
                                   explicit_bucket_boundaries_advisory=SECONDS)


# Training: recorded by the TrainingWorkflow (on the control workers) after each iteration.
ITERATIONS = _meter.create_counter("rollart_iterations", description="Iterations trained.")
STEP_PHASE_SECONDS = _meter.create_gauge(
    "rollart_step_phase_seconds", unit="s", description="The last iteration's time by phase: "
    "step (all of it), batch_wait (the trainer idle, waiting for a batch), train, "
    "weight_update (train end to every replica serving the new version), weight_push "
    "(publishing it), weight_exposed (replicas suspended to load it).")
TRAJECTORIES = _meter.create_counter(
    "rollart_trajectories", description="Trajectories by outcome: started, trained, evicted "
    "(failed ones: rollart_trajectory_failures_total).")
FAILURES = _meter.create_counter(
    "rollart_trajectory_failures", description="Failed trajectories by reason "
    "('<phase>: <error type>').")
IN_FLIGHT = _meter.create_gauge("rollart_trajectories_in_flight",
                                description="Started and not yet trained, evicted or failed.")
POLICY_VERSION = _meter.create_gauge("rollart_policy_version",
                                     description="The version the replicas serve.")
VERSION_LAG = _meter.create_histogram(
    "rollart_version_lag", description="Per trained trajectory: versions between the one it "
    "started under and the one it trained.", explicit_bucket_boundaries_advisory=VERSIONS)
REWARD_MEAN = _meter.create_gauge("rollart_reward_mean",
                                  description="The last batch's mean reward, by domain.")
SUCCESS_RATE = _meter.create_gauge("rollart_success_rate",
                                   description="The last batch's success rate, by domain.")
TRAINED_TOKENS_PER_S = _meter.create_gauge(
    "rollart_trained_tokens_per_second", description="Generated tokens of the last batch over "
    "its step time.")
STALE_TOKEN_SHARE = _meter.create_gauge(
    "rollart_stale_token_share", description="Share of the last batch's tokens sampled by an "
    "older version than the one trained.")

# Rollout: env workers, generation replicas, reward workers.
ENV_SECONDS = _seconds("rollart_env_seconds", "One env reset or step (op), by domain, "
                       "injected latency included.")
GENERATE_SECONDS = _seconds("rollart_generate_seconds", "One turn's generation on a replica, "
                            "waiting for an engine slot included.")
GENERATED_TOKENS = _meter.create_counter("rollart_generated_tokens",
                                         description="Tokens sampled, by replica.")
PROMPT_TOKENS = _meter.create_counter("rollart_prompt_tokens",
                                      description="Prompt tokens of each turn, by replica.")
CACHED_TOKENS = _meter.create_counter(
    "rollart_cached_prompt_tokens", description="Prompt tokens served from the engine's prefix "
    "cache, by replica (hit rate: over rollart_prompt_tokens_total).")
DRAFT_TOKENS = _meter.create_counter("rollart_speculation_draft_tokens",
                                     description="Tokens speculation proposed, by replica.")
ACCEPTED_TOKENS = _meter.create_counter(
    "rollart_speculation_accepted_tokens", description="Proposed tokens the model accepted, by "
    "replica (acceptance: over rollart_speculation_draft_tokens_total).")
REWARD_SECONDS = _seconds("rollart_reward_seconds", "One reward's computation, by kind.")

# Trainer and weights.
TRAIN_STEP_SECONDS = _seconds("rollart_train_step_seconds", "One train step, checkpoint "
                              "included.")
WEIGHT_SECONDS = _seconds("rollart_weight_seconds", "Moving one version: push (trainer), pull "
                          "and load (each replica), by op.")


@contextmanager
def timed(histogram, labels: dict[str, str] | None = None) -> Iterator[None]:
    """Record the block's wall time in `histogram`, also when it raises."""
    started = time.perf_counter()
    try:
        yield
    finally:
        histogram.record(time.perf_counter() - started, labels)


class CountedTotals:
    """The highest total this process has counted of each counter, per run.

    The TrainingWorkflow exports from workflow code, outside replay. A workflow task that runs
    again because its first try did not complete (a task timeout on a busy machine) is not a
    replay, so it exports the same iteration again; counting totals against the highest total
    already counted makes that second export add nothing. A run is a workflow id; `chain` (the
    first run id of a continue-as-new chain) tells a new run under an old id from the same one.
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str, dict[str, int]]] = {}

    def gain(self, run: str, chain: str, key: str, total: int, baseline: int = 0) -> int:
        """What `total` adds over `baseline` (counted by an earlier process, as the workflow's
        state says) and over what this process counted; it is counted from here on."""
        kept_chain, counted = self._runs.get(run, ("", {}))
        if kept_chain != chain:
            counted = {}
            self._runs[run] = (chain, counted)
        gained = total - max(baseline, counted.get(key, 0))
        if gained > 0:
            counted[key] = total
        return max(gained, 0)


_counted = CountedTotals()


def record_iteration(run: str, chain: str, metrics: IterationMetrics) -> None:
    """What the TrainingWorkflow knows at the end of an iteration; nothing if this process
    recorded the iteration already."""
    labels = {"run": run}
    if not _counted.gain(run, chain, "iterations", metrics.iteration + 1, metrics.iteration):
        return
    ITERATIONS.add(1, labels)
    for phase, seconds in (("step", metrics.step_s), ("batch_wait", metrics.trainer_idle_s),
                           ("train", metrics.train_s),
                           ("weight_update", metrics.weight_update_s),
                           ("weight_push", metrics.weight_push_s),
                           ("weight_exposed", metrics.weight_exposed_s)):
        STEP_PHASE_SECONDS.set(seconds, {**labels, "phase": phase})
    POLICY_VERSION.set(metrics.version, labels)
    for lag, count in metrics.lag_histogram.items():
        for _ in range(count):
            VERSION_LAG.record(lag, labels)
    for domain, figures in metrics.domains.items():
        REWARD_MEAN.set(figures.reward_mean, {**labels, "domain": domain})
        SUCCESS_RATE.set(figures.success_rate, {**labels, "domain": domain})
    TRAINED_TOKENS_PER_S.set(metrics.tokens_per_s, labels)
    STALE_TOKEN_SHARE.set(metrics.stale_token_share, labels)


def record_ledger(run: str, chain: str, ledger: Ledger, failures: dict[str, int],
                  exported: Ledger, exported_failures: dict[str, int]) -> None:
    """Count what the ledger and the failures by reason (both the run's totals) gained over
    what was counted before: `exported` and `exported_failures`, or more by this process."""
    for outcome in ("started", "trained", "evicted"):
        gained = _counted.gain(run, chain, outcome, getattr(ledger, outcome),
                               getattr(exported, outcome))
        if gained:
            TRAJECTORIES.add(gained, {"run": run, "outcome": outcome})
    for reason, total in failures.items():
        gained = _counted.gain(run, chain, f"failed: {reason}", total,
                               exported_failures.get(reason, 0))
        if gained:
            FAILURES.add(gained, {"run": run, "reason": reason})
    IN_FLIGHT.set(ledger.in_flight, {"run": run})
