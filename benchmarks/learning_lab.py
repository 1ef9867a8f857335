"""The learner alone: GRPO on the real Trainer over FrozenLake, sampled in process, no Temporal.

A full run spends ~13 s per iteration on 2 cores, mostly orchestration; here an iteration
takes about one second, so questions about the algorithm (how many iterations to the target,
what staleness does to it, which knob helps) get answers over many seeds in minutes. The
trainer, its loss, its off-policy correction and its trust region are the real ones, and each
batch is sampled from the same constrained temperature-1 distribution the engine samples from,
but by the torch model (a copy kept per version) instead of vLLM. Staleness is exact: a
variant's share of each batch's groups is sampled by the policy `lag` versions behind the
trainer (all of them: alpha-1 async at its worst; 0.65: about what a real alpha-1 run trains
on), the rest by the current one. A learning figure: the real tiny model and trainer.

Run: .venv/bin/python benchmarks/learning_lab.py [--seeds 5] [--iterations 30] [--variants ...]
[--keep] (writes results/learning_lab.json and learning_lab.md; --keep adds the variants run to
the written ones; --smoke: 2 iterations, nothing written; --trace: every step's figures
printed, nothing written)
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
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from rollart.blobs import LocalBlobs
from rollart.config import AlgorithmConfig
from rollart.contracts import TrainSample
from rollart.envs.frozenlake import ACTIONS, FrozenLakeEnv
from rollart.policy.model import ensure_tiny_model, resolve_model_path
from rollart.policy.trainer import Trainer
from rollart.store import TrajectoryStore, TurnRecord

HERE = Path(__file__).parent
TARGET = 0.8
MAX_TURNS = 10
TEMPERATURE = 1.0
# name -> (lag, stale share, AlgorithmConfig overrides): that share of each batch's groups is
# sampled `lag` versions behind, the rest by the trainer's current version. A real alpha-1 run
# trains on batches 0.64-0.70 stale. The variants with "epochs": 1 predate the epochs knob (one
# pass per batch, the default then); "fresh, epochs 4" is the default run's algorithm, fresh.
VARIANTS: dict[str, tuple[int, float, dict]] = {
    "fresh": (0, 0.0, {"epochs": 1}),
    "stale": (1, 1.0, {"epochs": 1}),
    "stale, entropy_coef 0.01": (1, 1.0, {"epochs": 1, "entropy_coef": 0.01}),
    "stale, tis_cap 1": (1, 1.0, {"epochs": 1, "tis_cap": 1.0}),
    "stale, target_kl 0.02": (1, 1.0, {"epochs": 1, "target_kl": 0.02}),
    "stale, sequence_mean": (1, 1.0, {"epochs": 1, "loss_aggregation": "sequence_mean"}),
    "stale, clip_eps_high 0.28": (1, 1.0, {"epochs": 1, "clip_eps_high": 0.28}),
    "stale, entropy_target 0.5": (1, 1.0, {"epochs": 1, "entropy_target": 0.5}),
    "stale, target_kl_lag_power 1": (1, 1.0, {"epochs": 1, "target_kl_lag_power": 1.0}),
    "stale, target_kl_lag_power 2": (1, 1.0, {"epochs": 1, "target_kl_lag_power": 2.0}),
    "mixed 0.65": (1, 0.65, {"epochs": 1}),
    "mixed 0.65, target_kl_lag_power 1": (1, 0.65, {"epochs": 1, "target_kl_lag_power": 1.0}),
    "mixed 0.65, target_kl_lag_power 2": (1, 0.65, {"epochs": 1, "target_kl_lag_power": 2.0}),
    "mixed 0.65, entropy_coef 0.01": (1, 0.65, {"epochs": 1, "entropy_coef": 0.01}),
    "fresh, batch 32": (0, 0.0, {"epochs": 1, "batch_size": 32}),
    "mixed 0.65, batch 32": (1, 0.65, {"epochs": 1, "batch_size": 32}),
    "mixed 0.65, learning_rate 2e-3": (1, 0.65, {"epochs": 1, "learning_rate": 2e-3}),
    "mixed 0.65, target_kl 0.1": (1, 0.65, {"epochs": 1, "target_kl": 0.1}),
    "mixed 0.65, learning_rate 2e-3, target_kl 0.1": (
        1, 0.65, {"epochs": 1, "learning_rate": 2e-3, "target_kl": 0.1}),
    "mixed 0.65, minibatches 1": (1, 0.65, {"epochs": 1, "minibatches": 1}),
    "mixed 0.65, epochs 2": (1, 0.65, {"epochs": 2}),
    "mixed 0.65, epochs 4": (1, 0.65, {"epochs": 4}),
    "mixed 0.65, group 16": (1, 0.65, {"epochs": 1, "group_size": 16}),
    "mixed 0.65, group 64": (1, 0.65, {"epochs": 1, "group_size": 64, "minibatches": 1}),
    "mixed 0.65, learning_rate 3e-3": (1, 0.65, {"epochs": 1, "learning_rate": 3e-3}),
    "lag 2": (2, 1.0, {"epochs": 1}),
    "lag 2, target_kl_lag_power 2": (2, 1.0, {"epochs": 1, "target_kl_lag_power": 2.0}),
    "fresh, epochs 4": (0, 0.0, {"epochs": 4}),
    "stale, epochs 4": (1, 1.0, {"epochs": 4}),
    "lag 2, epochs 4": (2, 1.0, {"epochs": 4}),
    "mixed 0.65, epochs 8": (1, 0.65, {"epochs": 8}),
}
console = Console()


def sample_batch(policies: list[tuple[torch.nn.Module, int]], trainer: Trainer,
                 algorithm: AlgorithmConfig, store: TrajectoryStore, iteration: int, seed: int,
                 ) -> tuple[list[TrainSample], float]:
    """One batch of episodes, group g played by policies[g] (a model and its version), one
    forward pass per model and turn; every episode's context is the same length at each turn
    (observations are), so none is padded."""
    tokenizer = trainer.tokenizer
    action_ids = [tokenizer.encode(a, add_special_tokens=False)[0] for a in ACTIONS]
    allowed = torch.tensor(action_ids)
    size, group = algorithm.batch_size, algorithm.group_size
    envs = [FrozenLakeEnv() for _ in range(size)]
    observations = [tokenizer.encode(env.reset(seed=seed)[0], add_special_tokens=False)
                    for env in envs]
    contexts = [list(ids) for ids in observations]
    turns, rewards = [0] * size, [0.0] * size
    generator = torch.Generator().manual_seed(seed * 100_003 + iteration)
    ids = [f"s{seed}i{iteration}t{b}" for b in range(size)]
    active = list(range(size))
    for turn in range(MAX_TURNS):
        if not active:
            break
        log_p = torch.empty(len(active), len(action_ids))
        for model in {id(m): m for m, _ in policies}.values():
            rows = [r for r, b in enumerate(active) if policies[b // group][0] is model]
            if rows:
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([contexts[active[r]] for r in rows])
                                   ).logits
                log_p[rows] = torch.log_softmax(logits[:, -1, allowed].float() / TEMPERATURE,
                                                dim=-1)
        choices = torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1).tolist()
        still = []
        for row, (b, choice) in enumerate(zip(active, choices, strict=True)):
            token = action_ids[choice]
            store.write_turn(ids[b], TurnRecord(
                turn=turn, observation_ids=observations[b], sampled_ids=[token],
                logprobs=[float(log_p[row, choice])], versions=[policies[b // group][1]],
                allowed_ids=action_ids))
            turns[b] = turn + 1
            result = envs[b].step(ACTIONS[choice])
            contexts[b].append(token)
            if result.terminated:
                rewards[b] = result.reward
            else:
                observations[b] = tokenizer.encode(result.observation, add_special_tokens=False)
                contexts[b] += observations[b]
                still.append(b)
        active = still
    samples = [TrainSample(trajectory_id=ids[b], reward=rewards[b], turns=turns[b],
                           group_id=f"s{seed}i{iteration}g{b // group}")
               for b in range(size)]
    return samples, sum(r > 0 for r in rewards) / size


def learn(model_path: str, algorithm: AlgorithmConfig, lag: int, stale_share: float,
          seed: int, iterations: int, trace: bool = False) -> list[float]:
    """Success per iteration of one seed's run; `trace` prints what each step saw and did."""
    trainer = Trainer(model_path, algorithm.learning_rate, seed=seed, threads=2)
    versions = [copy.deepcopy(trainer.model).eval()]
    curve = []
    with tempfile.TemporaryDirectory() as store_dir:
        store = TrajectoryStore(LocalBlobs(store_dir))
        for iteration in range(iterations):
            pick = random.Random(seed * 7919 + iteration)
            fresh = (versions[-1], trainer.version)
            stale = (versions[max(0, len(versions) - 1 - lag)], max(0, trainer.version - lag))
            policies = [stale if pick.random() < stale_share else fresh
                        for _ in range(algorithm.groups_per_batch)]
            samples, success = sample_batch(policies, trainer, algorithm, store, iteration,
                                            seed)
            step = trainer.train_step(store, samples, algorithm, TEMPERATURE).learning
            if trace:
                turns = sum(sample.turns for sample in samples) / len(samples)
                print(f"seed {seed} iteration {iteration}: success {success:.2f}, lag "
                      f"{step.mean_lag:.2f}, "
                      f"turns {turns:.1f}, entropy {step.entropy:.2f}, step KL "
                      f"{step.step_kl:.3f} (kept {step.step_kept:.2f}), ratio p05-p95 "
                      f"{step.ratio_p05:.2f}-{step.ratio_p95:.2f}, truncated "
                      f"{step.truncated_share:.2f}")
            versions = [*versions, copy.deepcopy(trainer.model).eval()][-(lag + 1):]
            curve.append(success)
    return curve


def summarize(curves: list[list[float]]) -> dict:
    hits = [next((i for i, s in enumerate(c) if s >= TARGET), None) for c in curves]
    reached = [h for h in hits if h is not None]
    return {"seeds": len(curves), "seeds_reaching_target": len(reached),
            "iterations_to_target": hits,
            "median_iterations_to_target": statistics.median(reached) if reached else None,
            "final_success": [round(c[-1], 3) for c in curves], "curves": curves}


def main(args: argparse.Namespace) -> dict:
    if (args.hidden, args.layers) == (128, 2):  # the default run's model
        model_path = resolve_model_path(None)
    else:
        model_path = ensure_tiny_model(
            Path(tempfile.gettempdir()) / f"rollart-lab-model-{args.hidden}x{args.layers}",
            hidden_size=args.hidden, layers=args.layers)
    base = {"batch_size": 16, "group_size": 4, "minibatches": 1} if args.smoke else {}
    variants = {k: VARIANTS[k] for k in args.variants}
    results = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("runs", total=len(variants) * len(args.seeds))
        for name, (lag, stale_share, overrides) in variants.items():
            algorithm = AlgorithmConfig(**{**base, **overrides})
            curves = []
            for seed in args.seeds:
                progress.update(task, description=f"{name}, seed {seed}")
                curves.append(learn(str(model_path), algorithm, lag, stale_share, seed,
                                    args.iterations, args.trace))
                progress.advance(task)
            results[name] = {"lag": lag, "stale_share": stale_share, "overrides": overrides,
                             "iterations": args.iterations, **summarize(curves)}
            progress.console.print(f"{name}: iterations to target "
                                   f"{results[name]['iterations_to_target']}")
    return {"target": TARGET, "iterations": args.iterations, "seeds": args.seeds,
            "model": {"hidden_size": args.hidden, "layers": args.layers},
            "batch_size": AlgorithmConfig(**base).batch_size, "variants": results}


def merged(previous: dict, new: dict) -> dict:
    """`new`'s variants over `previous`'s, in VARIANTS order; both must share seeds and model."""
    for key in ("target", "seeds", "model"):
        if previous.get(key) != new[key]:
            raise SystemExit(f"--keep: the kept results have {key} {previous.get(key)}, this run "
                             f"{new[key]}; rerun every variant instead")
    variants = {**previous["variants"], **new["variants"]}
    return {**new, "variants": {k: variants[k] for k in VARIANTS if k in variants}}


def report(results: dict) -> str:
    lines = [f"Success >= {results['target']} within each variant's iterations, seeds "
             f"{results['seeds']}, model {results['model']['hidden_size']}x"
             f"{results['model']['layers']}, batch {results['batch_size']} unless the variant "
             "says otherwise.", "",
             "| variant | lag | stale share | epochs | iterations | reached | median iterations "
             "| iterations per seed |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in results["variants"].items():
        hits = ", ".join("-" if h is None else str(h) for h in r["iterations_to_target"])
        epochs = r["overrides"].get("epochs", AlgorithmConfig().epochs)
        lines.append(f"| {name} | {r['lag']} | {r['stale_share']} | {epochs} | "
                     f"{r['iterations']} | "
                     f"{r['seeds_reaching_target']}/{r['seeds']} | "
                     f"{r['median_iterations_to_target'] or '-'} | {hits} |")
    return "\n".join(lines)


def write_results(stem: str, title: str, outcome: dict, about: str, table: str) -> None:
    """results/STEM.json, and STEM.md beside this script: the commands that made it, what its
    figures are, and their table."""
    written = HERE / "results" / f"{stem}.json"
    written.write_text(json.dumps(outcome, indent=1))
    (HERE / f"{stem}.md").write_text(
        f"# {title}\n\nCommands (2-core x86_64, no GPU; with --keep a run adds its variants "
        "to the kept ones):\n\n" + "".join(f"- `{c}`\n" for c in outcome["commands"])
        + "\nA learning figure: the real tiny model and trainer, batches sampled in process "
        f"(see the script's docstring){about}.\n\n{table}\n")
    print(f"wrote {written} and {HERE / f'{stem}.md'}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per variant")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--trace", action="store_true",
                        help="print every step's figures; writes nothing")
    parser.add_argument("--smoke", action="store_true", help="2 iterations; writes nothing")
    parser.add_argument("--keep", action="store_true",
                        help="merge into the written results (same seeds and model) instead of "
                        "replacing them")
    args = parser.parse_args()
    args.seeds = list(range(args.seeds))
    if args.smoke:
        args.seeds, args.iterations, args.variants = [0], 2, ["fresh", "stale"]
    return args


if __name__ == "__main__":
    arguments = parse_args()
    started = time.perf_counter()
    outcome = main(arguments)
    console.print(report(outcome))
    console.print(f"{time.perf_counter() - started:.0f} s")
    if arguments.smoke or arguments.trace:
        sys.exit(0)
    written = HERE / "results" / "learning_lab.json"
    command = shlex.join([".venv/bin/python", "benchmarks/learning_lab.py", *sys.argv[1:]])
    outcome["commands"] = [command]
    if arguments.keep and written.exists():
        previous = json.loads(written.read_text())
        outcome = merged(previous, outcome)
        outcome["commands"] = [*previous.get("commands", []), command]
    write_results("learning_lab", "Learning lab", outcome, "; a variant's stale share of each "
                  "batch's groups is sampled by the policy `lag` versions behind the trainer",
                  report(outcome))
