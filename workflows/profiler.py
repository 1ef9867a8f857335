"""The online profiler: which generation pool each task domain should use, learned from the run.

A static domain -> pool mapping (a domain's `gen_pool`) is right for the workload it was chosen
for; when response lengths drift during training it goes stale (RollArt leaves this open). Each
iteration the profiler folds in what the trained trajectories measured: per pool, the engine
seconds per prefill token and per decode token (each request charged its share of the engine's
time, so the charges add up to its busy time: latency, which grows with the queue, would make a
loaded pool look slow and a domain flap between pools); per domain, its turns and its prefill
and decode tokens per turn. A pool that has served nothing yet borrows a measured pool's rates,
scaled by the two accelerators' compute (prefill) and memory bandwidth (decode) from their data
sheets. From these it predicts each mapping's generation time per iteration, the busiest pool's
turn-seconds per replica, and recommends the fastest mapping among the pools each domain may
use. The run switches to it (`routing.remap`) only once it has beaten the current mapping by
`remap_margin` for `remap_patience` iterations in a row, so noise does not make a domain flap
between pools.

Pure and deterministic: the training workflow keeps one in its state.
"""

from __future__ import annotations

from itertools import product

from pydantic import BaseModel

from rollart.contracts import ProfileMetrics, TrajectoryResult


class Rates(BaseModel):
    prefill_s_per_token: float
    decode_s_per_token: float


class DomainLoad(BaseModel):
    turns: float  # per iteration
    prefill_tokens: float  # per turn
    decode_tokens: float  # per turn


class Accelerator(BaseModel):
    """What the profiler needs of a pool: its replicas and its hardware's data-sheet figures
    (None where the label is not a known accelerator, e.g. "cpu")."""

    replicas: int
    dense_tflops: float | None = None
    memory_tb_s: float | None = None


class Profiler(BaseModel):
    smoothing: float = 0.5
    pools: dict[str, Rates] = {}
    domains: dict[str, DomainLoad] = {}
    better_for: int = 0

    def observe(self, results: list[TrajectoryResult]) -> None:
        """Fold in one iteration's trajectories (exponential moving averages)."""
        tokens: dict[str, list[float]] = {}  # pool -> prefill tokens, s, decode tokens, s
        loads: dict[str, list[float]] = {}  # domain -> turns, prefill tokens, decode tokens
        for result in results:
            load = loads.setdefault(result.domain, [0.0, 0.0, 0.0])
            for pool, usage in result.gen_usage.items():
                sums = tokens.setdefault(pool, [0.0, 0.0, 0.0, 0.0])
                sums[0] += usage.prefill_tokens
                sums[1] += usage.prefill_s
                sums[2] += usage.decode_tokens
                sums[3] += usage.decode_s
                load[0] += usage.turns
                load[1] += usage.prefill_tokens
                load[2] += usage.decode_tokens
        for pool, (prefill, prefill_s, decode, decode_s) in tokens.items():
            seen = self.pools.get(pool)
            fresh = Rates(
                prefill_s_per_token=prefill_s / prefill if prefill else (
                    seen.prefill_s_per_token if seen else 0.0),
                decode_s_per_token=decode_s / decode if decode else (
                    seen.decode_s_per_token if seen else 0.0))
            self.pools[pool] = fresh if seen is None else Rates(
                prefill_s_per_token=self._blend(seen.prefill_s_per_token,
                                                fresh.prefill_s_per_token),
                decode_s_per_token=self._blend(seen.decode_s_per_token,
                                               fresh.decode_s_per_token))
        for domain, (turns, prefill, decode) in loads.items():
            if not turns:
                continue
            fresh = DomainLoad(turns=turns, prefill_tokens=prefill / turns,
                               decode_tokens=decode / turns)
            seen = self.domains.get(domain)
            self.domains[domain] = fresh if seen is None else DomainLoad(
                turns=self._blend(seen.turns, fresh.turns),
                prefill_tokens=self._blend(seen.prefill_tokens, fresh.prefill_tokens),
                decode_tokens=self._blend(seen.decode_tokens, fresh.decode_tokens))

    def _blend(self, old: float, new: float) -> float:
        return (1 - self.smoothing) * old + self.smoothing * new

    def rates(self, pool: str, accelerators: dict[str, Accelerator]) -> Rates | None:
        """Measured, or borrowed from a measured pool by the data sheets' ratios."""
        if pool in self.pools:
            return self.pools[pool]
        target = accelerators.get(pool)
        if target is None or target.dense_tflops is None or target.memory_tb_s is None:
            return None
        for name, measured in sorted(self.pools.items()):
            source = accelerators.get(name)
            if source is None or source.dense_tflops is None or source.memory_tb_s is None:
                continue
            return Rates(
                prefill_s_per_token=measured.prefill_s_per_token * source.dense_tflops
                / target.dense_tflops,
                decode_s_per_token=measured.decode_s_per_token * source.memory_tb_s
                / target.memory_tb_s)
        return None

    def predict(self, mapping: dict[str, str],
                accelerators: dict[str, Accelerator]) -> float | None:
        """Generation seconds per iteration under `mapping` (domain -> pool): the busiest
        pool's turn-seconds per replica. None if a mapped pool's rates are unknown."""
        busy: dict[str, float] = {}
        for domain, pool in mapping.items():
            load = self.domains.get(domain)
            if load is None:
                continue
            rates = self.rates(pool, accelerators)
            if rates is None:
                return None
            turn_s = (load.prefill_tokens * rates.prefill_s_per_token
                      + load.decode_tokens * rates.decode_s_per_token)
            busy[pool] = busy.get(pool, 0.0) + load.turns * turn_s
        return max((seconds / accelerators[pool].replicas for pool, seconds in busy.items()),
                   default=0.0)

    def recommend(self, choices: dict[str, list[str]], accelerators: dict[str, Accelerator],
                  ) -> tuple[dict[str, str], float | None]:
        """The fastest mapping giving each domain one of its `choices` (ties: the earlier
        choice, i.e. the configured pool)."""
        domains = sorted(choices)
        best, best_s = {d: choices[d][0] for d in domains}, None
        for pools in product(*(choices[d] for d in domains)):
            mapping = dict(zip(domains, pools, strict=True))
            seconds = self.predict(mapping, accelerators)
            if seconds is not None and (best_s is None or seconds < best_s - 1e-12):
                best, best_s = mapping, seconds
        return best, best_s

    def decide(self, current: dict[str, str], choices: dict[str, list[str]],
               accelerators: dict[str, Accelerator], remap: bool, margin: float,
               patience: int) -> ProfileMetrics:
        """This iteration's recommendation, and whether the run switches to it now."""
        recommended, recommended_s = self.recommend(choices, accelerators)
        current_s = self.predict(current, accelerators)
        better = (recommended != current and recommended_s is not None
                  and current_s is not None and recommended_s * (1 + margin) < current_s)
        self.better_for = self.better_for + 1 if better else 0
        switch = remap and better and self.better_for >= patience
        if switch:
            self.better_for = 0
        return ProfileMetrics(mapping=dict(current), recommended=recommended,
                              predicted_s=current_s, recommended_s=recommended_s,
                              remapped=switch,
                              pools={name: r.model_dump() for name, r in self.pools.items()})
