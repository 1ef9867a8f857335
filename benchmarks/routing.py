"""Cache-aware routing vs round-robin vs least-loaded across generation replicas, under high load.

Part 1, real engines: two vLLM replicas (each its own AsyncLLM and engine process) serve many
concurrent multi-turn trajectories whose context grows every turn (a shared group prompt, then an
observation per turn), so each turn's prompt is the previous turn's plus a little. Every request
is placed by rollart's router (`ReplicaTable`, the code the `gen.route` activity runs); the loop
drives the engines directly, because Temporal's ~200 ms per turn on this 2-core machine would hide
what the engines do. The KV cache is sized so that a replica holds its share of the trajectories
when they stay put, but not all of them. Each policy runs the same workload from a cold prefix
cache; policies alternate over the rounds to spread machine noise.

Part 2, simulated scale: 8 to 32 replicas of a cost-model engine (prefill cost per uncached
token, decode cost per batched step, an LRU prefix cache of fixed token capacity), the same router
code, a simulated clock.

Run: .venv/bin/python benchmarks/routing.py [--rounds 2] [--quick] [--smoke]
(writes results/routing.json and routing.md beside this file; --smoke: --quick in one round and
a small simulated fleet, nothing written)
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import random
import statistics
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from report import save
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rollart.activities.routing import ReplicaTable
from rollart.config import EngineConfig, RoutingConfig
from rollart.contracts import RouteRequest
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import ensure_tiny_model

POLICIES = ["round_robin", "least_loaded", "cache_aware"]
console = Console()


@dataclass
class Workload:
    groups: int = 16
    siblings: int = 4
    turns: int = 8
    prompt_tokens: int = 384
    observation_tokens: int = 64
    new_tokens: int = 4
    env_median_s: float = 0.02

    @property
    def trajectories(self) -> int:
        return self.groups * self.siblings


@dataclass
class Tally:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    new_tokens: int = 0

    def add(self, prompt: int, cached: int, new: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.new_tokens += new

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def routing_for(policy: str) -> RoutingConfig:
    return RoutingConfig(policy=policy)


# ---------------------------------------------------------------- part 1: real vLLM replicas

async def real_trajectory(table: ReplicaTable, engines: dict[str, PolicyEngine], pool: str,
                          policy: str, work: Workload, tid: str, gid: str, prompt: list[int],
                          vocab: list[int], actions: list[int], rng: random.Random,
                          tally: Tally) -> None:
    context = list(prompt)
    routing = routing_for(policy)
    for turn in range(work.turns):
        request = RouteRequest(request_id=f"{tid}.{turn}", trajectory_id=tid, group_id=gid,
                               context_tokens=len(context), pools=[(pool, len(engines))],
                               routing=routing)
        decision = table.route(request, time.monotonic())
        sample = await engines[decision.queue].generate(
            context, max_tokens=work.new_tokens, temperature=1.0, allowed_token_ids=actions,
            ignore_eos=True)
        table.release(request.request_id, "ok", time.monotonic())
        tally.add(len(context), sample.cached_tokens, len(sample.token_ids))
        context += sample.token_ids + rng.choices(vocab, k=work.observation_tokens)
        await asyncio.sleep(rng.lognormvariate(math.log(work.env_median_s), 1.0))


async def real_round(engines: dict[str, PolicyEngine], pool: str, policy: str, work: Workload,
                     vocab: list[int], actions: list[int], seed: int) -> dict:
    for engine in engines.values():
        await engine.llm.reset_prefix_cache()
    rng = random.Random(seed)
    prompts = [rng.choices(vocab, k=work.prompt_tokens) for _ in range(work.groups)]
    table, tally = ReplicaTable(), Tally()
    started = time.perf_counter()
    await asyncio.gather(*(
        real_trajectory(table, engines, pool, policy, work, f"g{g}.t{s}", f"g{g}", prompts[g],
                        vocab, actions, random.Random(seed * 1000 + g * 10 + s), tally)
        for g in range(work.groups) for s in range(work.siblings)))
    wall = time.perf_counter() - started
    return {"wall_s": wall, "cache_hit_rate": tally.hit_rate,
            "turns_per_s": tally.requests / wall,
            "prompt_tokens_per_s": tally.prompt_tokens / wall,
            "generated_tokens_per_s": tally.new_tokens / wall}


async def real_engines(args: argparse.Namespace, work: Workload) -> dict:
    model = ensure_tiny_model(
        Path(tempfile.gettempdir()) / f"rollart-bench-routing-model-{args.hidden}x{args.layers}",
        seed=0, hidden_size=args.hidden, layers=args.layers)
    config = EngineConfig(max_model_len=2048, kv_cache_mib=args.kv_mib, max_num_seqs=64)
    pool = "bench"
    engines = {}
    with console.status(f"starting {args.replicas} vLLM replicas"):
        for k in range(args.replicas):
            engines[f"rollart.gen.{pool}.r{k}"] = await PolicyEngine(str(model), config,
                                                                     seed=k).start()
    try:
        probe = next(iter(engines.values()))
        vocab = [i for i in range(len(probe.tokenizer)) if i not in
                 probe.tokenizer.all_special_ids]
        actions = probe.single_token_ids(["Left", "Right"])
        await real_round(engines, pool, "round_robin", Workload(groups=2, turns=2), vocab,
                         actions, seed=99)  # warm-up
        runs: dict[str, list[dict]] = {p: [] for p in POLICIES}
        with Progress(console=console) as progress:
            task = progress.add_task("real replicas", total=args.rounds * len(POLICIES))
            for round_ in range(args.rounds):
                order = POLICIES if round_ % 2 == 0 else POLICIES[::-1]
                for policy in order:
                    runs[policy].append(await real_round(engines, pool, policy, work, vocab,
                                                         actions, seed=round_))
                    progress.advance(task)
    finally:
        for engine in engines.values():
            engine.shutdown()
    return {policy: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
            for policy, rs in runs.items()}


# ---------------------------------------------------------------- part 2: simulated replicas

@dataclass
class CostModel:
    """Rough figures for a 7-8B model on one GPU: prefill ~33k tokens/s, a decode step of a
    64-sequence batch ~20 ms; the prefix cache holds 100k tokens (what is left of the KV memory
    after the running batch)."""

    prefill_s_per_token: float = 30e-6
    decode_s_per_step: float = 14e-3
    decode_s_per_sequence: float = 0.1e-3
    cache_tokens: int = 100_000
    max_batch: int = 64


@dataclass
class SimReplica:
    cost: CostModel
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    busy_until: float = 0.0

    def cached_prefix(self, tid: str, gid: str, context: int, shared: int) -> int:
        own = self.cache.get(tid, 0)
        group = self.cache.get(gid, 0)
        if own:
            self.cache.move_to_end(tid)
        if group:
            self.cache.move_to_end(gid)
        return min(max(own, min(group, shared)), context)

    def remember(self, key: str, tokens: int) -> None:
        self.cache[key] = tokens
        self.cache.move_to_end(key)
        while sum(self.cache.values()) > self.cost.cache_tokens and len(self.cache) > 1:
            self.cache.popitem(last=False)


def simulate(policy: str, replicas: int, work: Workload, cost: CostModel, seed: int) -> dict:
    """Discrete-event simulation: each replica runs batched steps; a step prefills the newly
    admitted requests' uncached tokens and decodes one token for every running request."""
    rng = random.Random(seed)
    routing = routing_for(policy)
    pool = "sim"
    table, tally = ReplicaTable(), Tally()
    sims = {f"rollart.gen.{pool}.r{k}": SimReplica(cost) for k in range(replicas)}
    events: list = []  # (time, order, kind, payload)
    order = 0

    def push(at: float, kind: str, payload) -> None:
        nonlocal order
        heapq.heappush(events, (at, order, kind, payload))
        order += 1

    state = {}
    for g in range(work.groups):
        for s in range(work.siblings):
            tid = f"g{g}.t{s}"
            state[tid] = {"gid": f"g{g}", "turn": 0, "context": work.prompt_tokens}
            push(rng.random() * 0.05, "arrive", tid)
    finished_at = 0.0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            tid, st = payload, state[payload]
            request = RouteRequest(request_id=f"{tid}.{st['turn']}", trajectory_id=tid,
                                   group_id=st["gid"], context_tokens=st["context"],
                                   pools=[(pool, replicas)], routing=routing)
            queue = table.route(request, now).queue
            replica = sims[queue]
            cached = replica.cached_prefix(tid, st["gid"], st["context"], work.prompt_tokens)
            tally.add(st["context"], cached, work.new_tokens)
            replica.waiting.append({"tid": tid, "uncached": st["context"] - cached,
                                    "left": work.new_tokens, "rid": request.request_id})
            if replica.busy_until <= now:
                push(now, "step", queue)
        elif kind == "step":
            replica = sims[payload]
            if replica.busy_until > now or not (replica.waiting or replica.running):
                continue
            admitted = replica.waiting[:cost.max_batch - len(replica.running)]
            replica.waiting = replica.waiting[len(admitted):]
            replica.running += admitted
            step = (cost.decode_s_per_step + cost.decode_s_per_sequence * len(replica.running)
                    + cost.prefill_s_per_token * sum(r["uncached"] for r in admitted))
            done_at = now + step
            replica.busy_until = done_at
            for r in replica.running:
                r["uncached"] = 0
                r["left"] -= 1
            for r in [r for r in replica.running if r["left"] == 0]:
                replica.running.remove(r)
                push(done_at, "done", (payload, r))
            push(done_at, "step", payload)
        elif kind == "done":
            queue, r = payload
            st = state[r["tid"]]
            table.release(r["rid"], "ok", now)
            st["context"] += work.new_tokens
            sims[queue].remember(r["tid"], st["context"])
            sims[queue].remember(st["gid"], work.prompt_tokens)
            st["turn"] += 1
            finished_at = max(finished_at, now)
            if st["turn"] < work.turns:
                st["context"] += work.observation_tokens
                push(now + rng.lognormvariate(math.log(work.env_median_s), 1.0), "arrive",
                     r["tid"])
    return {"cache_hit_rate": tally.hit_rate, "turns_per_s": tally.requests / finished_at,
            "makespan_s": finished_at}


def simulated_scale(sizes: list[int], work_per_replica: Workload, cost: CostModel) -> dict:
    results = {}
    for replicas in sizes:
        work = Workload(groups=work_per_replica.groups * replicas,
                        siblings=work_per_replica.siblings, turns=work_per_replica.turns,
                        prompt_tokens=work_per_replica.prompt_tokens,
                        observation_tokens=work_per_replica.observation_tokens,
                        new_tokens=work_per_replica.new_tokens,
                        env_median_s=work_per_replica.env_median_s)
        results[replicas] = {policy: simulate(policy, replicas, work, cost, seed=replicas)
                             for policy in POLICIES}
    return results


# ---------------------------------------------------------------- report

def ratio(results: dict, key: str, policy: str, baseline: str) -> float:
    return results[policy][key] / results[baseline][key]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--kv-mib", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="a small workload")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    args = parser.parse_args()
    if args.smoke:
        args.quick, args.rounds = True, 1
    work = Workload(groups=4, turns=3) if args.quick else Workload()
    real = asyncio.run(real_engines(args, work))
    sim_work = Workload(groups=8, siblings=4, turns=10, prompt_tokens=1024,
                        observation_tokens=128, new_tokens=32, env_median_s=0.05)
    sizes = [2] if args.smoke else [8] if args.quick else [8, 16, 32]
    sim = simulated_scale(sizes, sim_work, CostModel())

    table = Table(title=f"real: {args.replicas} vLLM replicas, {work.trajectories} concurrent "
                        f"trajectories x {work.turns} turns (median of {args.rounds} rounds)")
    for column in ("policy", "cache hit rate", "turns/s", "prompt tok/s", "wall s",
                   "throughput vs round_robin"):
        table.add_column(column, justify="right")
    rows = []
    for policy in POLICIES:
        r = real[policy]
        row = [policy, f"{r['cache_hit_rate']:.3f}", f"{r['turns_per_s']:.1f}",
               f"{r['prompt_tokens_per_s']:.0f}", f"{r['wall_s']:.1f}",
               f"{ratio(real, 'turns_per_s', policy, 'round_robin'):.2f}"]
        table.add_row(*row)
        rows.append("| " + " | ".join(row) + " |")
    console.print(table)
    sim_table = Table(title="simulated: cost-model replicas, 32 trajectories per replica")
    for column in ("replicas", "policy", "cache hit rate", "turns/s", "vs round_robin"):
        sim_table.add_column(column, justify="right")
    sim_rows = []
    for replicas, by_policy in sim.items():
        for policy in POLICIES:
            r = by_policy[policy]
            row = [str(replicas), policy, f"{r['cache_hit_rate']:.3f}",
                   f"{r['turns_per_s']:.1f}",
                   f"{ratio(by_policy, 'turns_per_s', policy, 'round_robin'):.2f}"]
            sim_table.add_row(*row)
            sim_rows.append("| " + " | ".join(row) + " |")
    console.print(sim_table)

    results = {
        "cache_hit_rate_cache_aware": real["cache_aware"]["cache_hit_rate"],
        "cache_hit_rate_round_robin": real["round_robin"]["cache_hit_rate"],
        "cache_hit_rate_least_loaded": real["least_loaded"]["cache_hit_rate"],
        "throughput_ratio_cache_aware_vs_round_robin":
            ratio(real, "turns_per_s", "cache_aware", "round_robin"),
        "throughput_ratio_cache_aware_vs_least_loaded":
            ratio(real, "turns_per_s", "cache_aware", "least_loaded"),
        "real": real,
        "simulated": {str(k): v for k, v in sim.items()},
        "simulated_throughput_ratio_cache_aware_vs_round_robin": {
            str(k): ratio(v, "turns_per_s", "cache_aware", "round_robin")
            for k, v in sim.items()},
        "setup": {"replicas": args.replicas, "rounds": args.rounds, "hidden": args.hidden,
                  "layers": args.layers, "kv_cache_mib": args.kv_mib,
                  "workload": work.__dict__, "simulated_workload": sim_work.__dict__,
                  "cost_model": CostModel().__dict__},
    }
    header = ("| policy | cache hit rate | turns/s | prompt tok/s | wall s "
              "| throughput vs round_robin |")
    sim_header = "| replicas | policy | cache hit rate | turns/s | vs round_robin |"
    if args.smoke:
        return
    save("routing", results, "Routing: cache-aware vs round-robin vs least-loaded",
         "python benchmarks/routing.py" + (" --quick" if args.quick else ""),
         [table.title, "", header, "|" + "---|" * 6, *rows, "", sim_table.title, "",
          sim_header, "|" + "---|" * 5, *sim_rows])


if __name__ == "__main__":
    main()
