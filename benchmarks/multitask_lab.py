"""Two domains, one learner: GRPO on the real Trainer over FrozenLake and arithmetic, sampled in
process, no Temporal (examples/multitask.toml's domains and algorithm).

The full multitask benchmark (async_vs_sync.py --multitask-only) takes about 7 minutes a run and
measures a domain by its training batches' success, which swings with 8-56 episodes of it a
batch; here a run takes about a minute, and arithmetic is measured exactly every iteration: the
policy's expected success over all the example's problems (every sum of two operands 0-4), its
probability of the right digit averaged over them, under the sampling distribution the engine
samples from. FrozenLake's figure is its batch success, and at the end 256 episodes of the
final policy. Groups get their domain as the real run gives it (`domain_sampling`, the
workflow's own DomainMix), and staleness as learning_lab.py models it: each group is sampled by
the policy one version behind with probability `stale_share` (0.65: about what a real alpha-1
run trains on). A learning figure: the real tiny model and trainer.

Run: .venv/bin/python benchmarks/multitask_lab.py [--seeds 5] [--iterations 40]
[--variants ...] [--keep] (writes results/multitask_lab.json and multitask_lab.md; --keep adds
the variants run to the written ones; --smoke: 2 iterations, nothing written)
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import torch
from learning_lab import TEMPERATURE, sample_batch, write_results
from rich.console import Console
from rich.progress import Progress

from rollart.blobs import LocalBlobs
from rollart.config import AlgorithmConfig
from rollart.contracts import TrainSample
from rollart.envs.arithmetic import DIGITS, ArithmeticEnv, spell
from rollart.policy.model import resolve_model_path
from rollart.policy.trainer import Trainer
from rollart.store import TrajectoryStore, TurnRecord
from rollart.workflows.buffer import DomainMix

HERE = Path(__file__).parent
EXAMPLE = tomllib.loads((HERE.parent / "examples" / "multitask.toml").read_text())
ARITHMETIC = EXAMPLE["domains"]["arithmetic"]["kwargs"]
DOMAINS = ("frozenlake", "arithmetic")
STALE_SHARE = 0.65
# name -> (domains trained, AlgorithmConfig overrides on top of the example's algorithm)
VARIANTS: dict[str, tuple[tuple[str, ...], dict]] = {
    "together": (DOMAINS, {}),
    "frozenlake alone": (("frozenlake",), {}),
    "arithmetic alone": (("arithmetic",), {}),
    "together, trust_region domain": (DOMAINS, {"trust_region": "domain"}),
    "together, domain_sampling weight": (DOMAINS, {"domain_sampling": "weight"}),
    "arithmetic alone, target_kl 0.1": (("arithmetic",), {"target_kl": 0.1}),
    "together, arithmetic groups of 4": (DOMAINS, {"arithmetic_split": 2}),
    "together, entropy_coef 0.01": (DOMAINS, {"entropy_coef": 0.01}),
    "arithmetic alone, batch 32": (("arithmetic",), {"batch_size": 32}),
    "arithmetic alone, batch 128": (("arithmetic",), {"batch_size": 128}),
    "together, batch 128": (DOMAINS, {"batch_size": 128,
                                      "alone": "arithmetic alone, batch 128"}),
}
LAB_KEYS = ("arithmetic_split", "alone")  # the lab's own, not the algorithm's
console = Console()


def algorithm_of(overrides: dict) -> AlgorithmConfig:
    example = {k: v for k, v in EXAMPLE["algorithm"].items() if k != "iterations"}
    overrides = {k: v for k, v in overrides.items() if k not in LAB_KEYS}
    return AlgorithmConfig(**{**example, **overrides})


class Arithmetic:
    """The example's arithmetic problems, tokenized once: sampling a group and the exact
    evaluation read the same prompts."""

    def __init__(self, tokenizer) -> None:
        self.env = ArithmeticEnv(**ARITHMETIC)
        self.digit_ids = [tokenizer.encode(d, add_special_tokens=False)[0] for d in DIGITS]
        pairs = [(a, b) for a in range(self.env.low, self.env.high + 1)
                 for b in range(self.env.low, self.env.high + 1)]
        self.prompts = [tokenizer.encode(f"{spell(a)} + {spell(b)} =", add_special_tokens=False)
                        for a, b in pairs]
        self.answers = torch.tensor([a + b for a, b in pairs])
        self.tokenizer = tokenizer

    def log_p(self, model: torch.nn.Module, prompts: list[list[int]]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(prompts)).logits[:, -1, self.digit_ids]
        return torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)

    def expected_success(self, model: torch.nn.Module) -> float:
        """Mean over every problem of the probability of sampling its answer."""
        log_p = self.log_p(model, self.prompts)
        return float(log_p.gather(1, self.answers[:, None]).exp().mean())

    def stuck_share(self, model: torch.nn.Module) -> float:
        """The share of problems whose policy puts over 0.9 on one wrong answer: its groups all
        answer alike, so they carry no signal to get out."""
        p = self.log_p(model, self.prompts).exp()
        p[torch.arange(len(p)), self.answers] = 0.0
        return float((p.max(dim=1).values > 0.9).float().mean())

    def digit_rows(self, model: torch.nn.Module) -> torch.Tensor:
        """The answer digits' rows of the (tied) embeddings: their output projections."""
        return model.get_input_embeddings().weight[self.digit_ids]

    def stuck_shares(self, model: torch.nn.Module, digit_rows_before: torch.Tensor) -> dict:
        """The stuck share after a step, and what it would be had the step left the digits'
        rows where they were (everything else moved as it did)."""
        stuck = self.stuck_share(model)
        weight = model.get_input_embeddings().weight
        with torch.no_grad():
            moved = weight[self.digit_ids].clone()
            weight[self.digit_ids] = digit_rows_before
            unmoved = self.stuck_share(model)
            weight[self.digit_ids] = moved
        return {"stuck": stuck, "stuck_without_digit_rows_step": unmoved}

    def sample_groups(self, policies: list[tuple[torch.nn.Module, int]], group: int,
                      store: TrajectoryStore, tag: str, seeds: list[int],
                      generator: torch.Generator) -> list[TrainSample]:
        """One group per policy, each on the problem its env seed draws."""
        samples = []
        for g, ((model, version), seed) in enumerate(zip(policies, seeds, strict=True)):
            prompt = self.tokenizer.encode(self.env.reset(seed)[0], add_special_tokens=False)
            log_p = self.log_p(model, [prompt])[0]
            choices = torch.multinomial(log_p.exp(), group, replacement=True,
                                        generator=generator).tolist()
            for k, choice in enumerate(choices):
                trajectory = f"{tag}a{g}t{k}"
                store.write_turn(trajectory, TurnRecord(
                    turn=0, observation_ids=prompt, sampled_ids=[self.digit_ids[choice]],
                    logprobs=[float(log_p[choice])], versions=[version],
                    allowed_ids=self.digit_ids))
                reward = self.env.step(DIGITS[choice]).reward
                samples.append(TrainSample(trajectory_id=trajectory, group_id=f"{tag}a{g}",
                                           reward=reward, turns=1, domain="arithmetic"))
        return samples


def frozenlake_groups(policies: list[tuple[torch.nn.Module, int]], trainer: Trainer,
                      algorithm: AlgorithmConfig, store: TrajectoryStore, iteration: int,
                      seed: int) -> tuple[list[TrainSample], float]:
    if not policies:
        return [], float("nan")
    sized = algorithm.model_copy(update={"batch_size": len(policies) * algorithm.group_size})
    samples, success = sample_batch(policies, trainer, sized, store, iteration, seed)
    return [s.model_copy(update={"domain": "frozenlake"}) for s in samples], success


def learn(model_path: str, algorithm: AlgorithmConfig, domains: tuple[str, ...], seed: int,
          iterations: int, arithmetic_split: int = 1) -> dict:
    """One run: per iteration, each domain's groups and success (arithmetic's exact). With
    `arithmetic_split`, each arithmetic group's episodes go to that many smaller groups, each
    on its own problem (more problems a step for the same episodes)."""
    trainer = Trainer(model_path, algorithm.learning_rate, seed=seed, threads=2)
    arithmetic = Arithmetic(trainer.tokenizer)
    versions = [copy.deepcopy(trainer.model).eval()]
    mix, weights = DomainMix(), {d: 1.0 for d in domains}
    curve = {d: [] for d in domains}
    steps: list[dict] = []
    episodes = {d: [] for d in domains}
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    if "arithmetic" in domains:
        curve["arithmetic"].append(arithmetic.expected_success(trainer.model))
    with tempfile.TemporaryDirectory() as store_dir:
        store = TrajectoryStore(LocalBlobs(store_dir))
        for iteration in range(iterations):
            fresh = (versions[-1], trainer.version)
            stale = (versions[0], max(0, trainer.version - 1))
            drawn = {d: [] for d in domains}
            for _ in range(algorithm.groups_per_batch):
                domain = (mix.next_domain(weights, algorithm.domain_signal_floor)
                          if algorithm.domain_sampling == "signal" else
                          domains[sum(map(len, drawn.values())) % len(domains)])
                drawn[domain].append(stale if rng.random() < STALE_SHARE else fresh)
            samples, success = frozenlake_groups(drawn.get("frozenlake", []), trainer,
                                                 algorithm, store, iteration, seed)
            if "frozenlake" in domains:
                curve["frozenlake"].append(success)
            if "arithmetic" in domains:
                policies = [p for p in drawn["arithmetic"] for _ in range(arithmetic_split)]
                seeds = [rng.randint(0, 2**31 - 1) for _ in policies]
                samples += arithmetic.sample_groups(
                    policies, algorithm.group_size // arithmetic_split, store,
                    f"s{seed}i{iteration}", seeds, generator)
            for d in domains:
                episodes[d].append(len(drawn[d]) * algorithm.group_size)
            by_group: dict[str, list[TrainSample]] = {}
            for sample in samples:
                by_group.setdefault(sample.group_id, []).append(sample)
            for members in by_group.values():
                mix.observe(members[0].domain, [m.reward for m in members])
            digit_rows = arithmetic.digit_rows(trainer.model).clone()
            learning = trainer.train_step(store, samples, algorithm, TEMPERATURE).learning
            steps.append({"kl_by_domain": learning.step_kl_by_domain, "kept": learning.step_kept,
                          **(arithmetic.stuck_shares(trainer.model, digit_rows)
                             if "arithmetic" in domains else {})})
            versions = [versions[-1], copy.deepcopy(trainer.model).eval()]
            if "arithmetic" in domains:
                curve["arithmetic"].append(arithmetic.expected_success(trainer.model))
        final = {}
        if "frozenlake" in domains:
            policy = [(trainer.model, trainer.version)] * 32
            final["frozenlake"] = frozenlake_groups(policy, trainer, algorithm, store,
                                                    iterations, seed + 10_000)[1]
        if "arithmetic" in domains:
            final["arithmetic"] = curve["arithmetic"][-1]
    return {"curve": curve, "episodes": episodes, "final": final, "steps": steps}


def at_episodes(run: dict, domain: str, count: float) -> float:
    """Arithmetic's exact success once the run had trained `count` episodes of it."""
    trained = 0
    for k, n in enumerate(run["episodes"][domain]):
        trained += n
        if trained >= count:
            return run["curve"][domain][k + 1]
    return run["curve"][domain][-1]


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def summarize(runs: dict[str, list[dict]]) -> dict:
    summary = {}
    for name, seeds in runs.items():
        row = {d: spread([r["final"][d] for r in seeds]) for d in seeds[0]["final"]}
        if "arithmetic" in seeds[0]["final"] and "frozenlake" in seeds[0]["final"]:
            row["arithmetic_episodes"] = statistics.fmean(
                sum(r["episodes"]["arithmetic"]) for r in seeds)
        if "arithmetic" in seeds[0]["final"]:
            row["peak_stuck"] = spread([max(x["stuck"] for x in r["steps"]) for r in seeds])
            row["step_stuck_rises"] = sum(
                x["stuck"] - before["stuck"] >= 0.2 for r in seeds
                for before, x in zip(r["steps"], r["steps"][1:], strict=False))
            row["of_them_undone_by_digit_rows"] = sum(
                x["stuck"] - before["stuck"] >= 0.2
                and x["stuck_without_digit_rows_step"] - before["stuck"] < 0.1
                for r in seeds for before, x in zip(r["steps"], r["steps"][1:], strict=False))
        summary[name] = row
    for name, row in summary.items():
        alone = runs.get(VARIANTS[name][1].get("alone", "arithmetic alone"))
        if alone and "arithmetic_episodes" in row:
            row["arithmetic_alone_at_those_episodes"] = spread(
                [at_episodes(r, "arithmetic", row["arithmetic_episodes"]) for r in alone])
    return summary


def report(results: dict) -> str:
    lines = [f"Seeds {results['seeds']}, {results['iterations']} iterations, "
             f"stale share {STALE_SHARE}; mean (min-max) over seeds. Arithmetic: exact expected "
             "success of the final policy over all 25 problems; FrozenLake: 256 episodes of the "
             "final policy. Stuck: the share of arithmetic problems on which the policy puts "
             "over 0.9 on one wrong answer (their groups carry no signal); a rise is a step "
             "that raised it by 0.2 or more, undone when the same step with the 10 digits' "
             "embedding rows left as they were would have raised it by under 0.1. Arithmetic "
             "alone at those episodes: the variant's own alone run where it names one (the same "
             "batch size), `arithmetic alone` otherwise.", "",
             "| variant | arithmetic | FrozenLake | arithmetic episodes | arithmetic alone at "
             "those episodes | peak stuck | rises (undone by the digit rows) |",
             "|---|---|---|---:|---|---|---|"]

    def text(stat: dict | None) -> str:
        return "-" if not stat else f"{stat['mean']:.2f} ({stat['min']:.2f}-{stat['max']:.2f})"

    for name, row in results["summary"].items():
        episodes = row.get("arithmetic_episodes")
        lines.append(f"| {name} | {text(row.get('arithmetic'))} | {text(row.get('frozenlake'))} "
                     f"| {'-' if episodes is None else f'{episodes:.0f}'} "
                     f"| {text(row.get('arithmetic_alone_at_those_episodes'))} "
                     f"| {text(row.get('peak_stuck'))} "
                     f"| {row.get('step_stuck_rises', '-')} "
                     f"({row.get('of_them_undone_by_digit_rows', '-')}) |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> dict:
    model_path = resolve_model_path(None)
    base = {"batch_size": 16, "group_size": 4, "minibatches": 1} if args.smoke else {}
    runs: dict[str, list[dict]] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("runs", total=len(args.variants) * len(args.seeds))
        for name in args.variants:
            domains, overrides = VARIANTS[name]
            algorithm = algorithm_of({**overrides, **base})
            runs[name] = []
            for seed in args.seeds:
                progress.update(task, description=f"{name}, seed {seed}")
                runs[name].append(learn(model_path, algorithm, domains, seed, args.iterations,
                                        overrides.get("arithmetic_split", 1)))
                progress.console.print(f"{name} seed {seed}: {runs[name][-1]['final']}")
                progress.advance(task)
    return {"iterations": args.iterations, "seeds": args.seeds, "runs": runs}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per variant")
    parser.add_argument("--iterations", type=int, default=EXAMPLE["algorithm"]["iterations"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--smoke", action="store_true", help="2 iterations; writes nothing")
    parser.add_argument("--keep", action="store_true",
                        help="merge into the written results (same seeds and iterations)")
    args = parser.parse_args()
    args.seeds = list(range(args.seeds))
    if args.smoke:
        args.seeds, args.iterations = [0], 2
    return args


if __name__ == "__main__":
    arguments = parse_args()
    started = time.perf_counter()
    outcome = main(arguments)
    written = HERE / "results" / "multitask_lab.json"
    command = shlex.join([".venv/bin/python", "benchmarks/multitask_lab.py", *sys.argv[1:]])
    outcome["commands"] = [command]
    if arguments.keep and not arguments.smoke:
        previous = json.loads(written.read_text())
        if (previous["seeds"], previous["iterations"]) != (outcome["seeds"],
                                                           outcome["iterations"]):
            raise SystemExit("--keep: the kept results have other seeds or iterations")
        runs = {**previous["runs"], **outcome["runs"]}
        outcome["runs"] = {k: runs[k] for k in VARIANTS if k in runs}
        outcome["commands"] = [*previous["commands"], command]
    outcome["summary"] = summarize(outcome["runs"])
    console.print(report(outcome))
    console.print(f"{time.perf_counter() - started:.0f} s")
    if arguments.smoke:
        sys.exit(0)
    write_results("multitask_lab", "Multitask lab", outcome, "", report(outcome))
