"""The torch trainer on one process vs sharded over two data-parallel ranks (FSDP2, gloo).

Both train the same model on the same stored batch (32 FrozenLake-like trajectories of 8 turns,
GRPO groups of 8, 2 minibatches, 2 epochs) for a few steps, one after the other in this
process: the single trainer with every core, the sharded one with one core per rank. Per rank
it counts the bytes of training state the rank holds (weights, gradients, Adam's moments: the
local shards' sizes, exactly) and reads its peak resident memory; it times each step (median)
and checks the two end with the same weights.

Run: .venv/bin/python benchmarks/sharded_trainer.py [--hidden 512] [--layers 8] [--steps 4]
(writes results/sharded_trainer.json and sharded_trainer.md beside this file; --smoke: the tiny
model, 1 step, nothing written)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from report import save
from rich.console import Console
from rich.table import Table

from rollart.config import AlgorithmConfig
from rollart.contracts import TrainSample
from rollart.envs.frozenlake import ACTIONS
from rollart.policy.model import ensure_tiny_model, resolve_model_path
from rollart.policy.sharded import ShardedTrainer
from rollart.policy.trainer import Trainer
from rollart.store import TrajectoryStore, TurnRecord

console = Console()
ALGORITHM = AlgorithmConfig(group_size=8, batch_size=32, minibatches=2, epochs=2)


def fill_store(store: TrajectoryStore, trainer: Trainer, turns: int = 8) -> list[TrainSample]:
    rng = random.Random(0)
    actions = trainer.tokenizer.convert_tokens_to_ids(ACTIONS)
    samples = []
    for index in range(ALGORITHM.batch_size):
        tid, group = f"t{index}", f"g{index // ALGORITHM.group_size}"
        for turn in range(turns):
            action = rng.choice(actions)
            store.write_turn(tid, TurnRecord(
                turn=turn, observation_ids=[rng.randrange(3, trainer.vocab_size)
                                            for _ in range(16)],
                sampled_ids=[action], logprobs=[-1.39], versions=[0], allowed_ids=actions))
        samples.append(TrainSample(trajectory_id=tid, group_id=group,
                                   reward=float(rng.random() < 0.4), turns=turns))
    return samples


def state_bytes(trainer: Trainer) -> int:
    """Weights, gradients and optimizer state this rank holds (local shards only)."""
    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    total = 0
    for parameter in trainer._parameters():  # the shards, not gathered copies
        total += local(parameter).numel() * parameter.element_size() * 2  # weight + gradient
        for value in trainer.optimizer.state.get(parameter, {}).values():
            if torch.is_tensor(value) and value.dim():
                total += local(value).numel() * value.element_size()
    return total


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(trainer: Trainer, store: TrajectoryStore, samples: list[TrainSample],
            steps: int) -> dict:
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.train_step(store, samples, ALGORITHM, temperature=1.0)
        seconds.append(time.perf_counter() - started)
    return {"step_s_median": statistics.median(seconds), "step_s": seconds,
            "state_mib_per_rank": state_bytes(trainer) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        model_path, args.steps = resolve_model_path(None), 1
    else:
        model_path = str(ensure_tiny_model(
            Path(tempfile.gettempdir()) / f"rollart-bench-h{args.hidden}-l{args.layers}",
            hidden_size=args.hidden, layers=args.layers))
    cores = os.cpu_count() or 2
    store = TrajectoryStore(tempfile.mkdtemp(prefix="rollart-sharded-"))

    single = Trainer(model_path, learning_rate=1e-3, threads=cores)
    samples = fill_store(store, single)
    parameters = sum(p.numel() for p in single.model.parameters())
    console.print(f"model: {parameters / 1e6:.1f} M parameters; {args.steps} steps each")
    one = measure(single, store, samples, args.steps)
    one["peak_rss_mib"] = [peak_rss_mib(os.getpid())]
    single_weights = dict(single.named_weights())
    del single

    sharded = ShardedTrainer(model_path, learning_rate=1e-3, threads=max(cores // 2, 1),
                             ranks=2)
    try:
        two = measure(sharded, store, samples, args.steps)
        two["peak_rss_mib"] = [peak_rss_mib(os.getpid())] + [
            peak_rss_mib(f.pid) for f in sharded.followers]
        gap = max(float((w - single_weights[n]).abs().max())
                  for n, w in sharded.named_weights())
    finally:
        sharded.close()

    results = {
        "model_parameters": parameters, "steps": args.steps, "cores": cores,
        "batch": ALGORITHM.batch_size, "turns": 8,
        "single": one, "two_ranks": two,
        "step_time_ratio_two_ranks_vs_single": two["step_s_median"] / one["step_s_median"],
        "state_ratio_per_rank": two["state_mib_per_rank"] / one["state_mib_per_rank"],
        "max_weight_gap_after_steps": gap,
    }
    table = Table(title="torch trainer: one process vs two FSDP2 ranks")
    for column in ("trainer", "threads per rank", "step s (median)", "x single",
                   "training state MiB per rank", "x single", "peak RSS MiB per process"):
        table.add_column(column)
    rows = [("1 process", cores, one, 1.0, 1.0),
            ("2 FSDP2 ranks", max(cores // 2, 1), two,
             results["step_time_ratio_two_ranks_vs_single"], results["state_ratio_per_rank"])]
    body = ["| trainer | threads per rank | step s (median) | x single | training state MiB "
            "per rank | x single | peak RSS MiB per process |", "|---|---|---|---|---|---|---|"]
    for name, threads, figures, time_ratio, state_ratio in rows:
        cells = (name, str(threads), f"{figures['step_s_median']:.2f}", f"{time_ratio:.2f}",
                 f"{figures['state_mib_per_rank']:.1f}", f"{state_ratio:.2f}",
                 " / ".join(f"{m:.0f}" for m in figures["peak_rss_mib"]))
        table.add_row(*cells)
        body.append("| " + " | ".join(cells) + " |")
    console.print(table)
    console.print(f"largest weight difference after {args.steps} steps: {gap:.2e}")
    if args.smoke:
        return
    command = ("`.venv/bin/python benchmarks/sharded_trainer.py --hidden "
               f"{args.hidden} --layers {args.layers} --steps {args.steps}`")
    save("sharded_trainer", results, "Torch trainer: one process vs two FSDP2 ranks",
         command.strip("`"), [
             f"System figures (real trainer, this machine's CPU). Model: the tiny Qwen3 made "
             f"wider and deeper ({parameters / 1e6:.1f} M parameters, fp32); batch "
             f"{ALGORITHM.batch_size} trajectories of 8 turns (16 observation tokens and 1 "
             f"sampled each), {ALGORITHM.minibatches} minibatches, {ALGORITHM.epochs} epochs; "
             f"{args.steps} steps each, one trainer after the other in one process. Training "
             "state: the weights, gradients and Adam moments a rank holds (its shards' bytes, "
             "counted). Peak RSS: the process's high-water mark (rank 0's includes the single "
             "trainer that ran first in the same process).", "", *body, "",
             f"Largest weight difference between the two after {args.steps} steps: {gap:.2e}.",
         ])


if __name__ == "__main__":
    main()
