"""SuffixDecoding in rollout: tokens/s with speculation off, always on, and adaptive, at low and
at high load, in one run.

The policy is a low-entropy one, as an RL policy becomes late in training: the tiny model,
fine-tuned in this script to answer each of a few prompts with its own fixed 64-token response,
then sampled at temperature 1 (it still strays now and then). Prompts recur across requests as
GRPO siblings and later iterations repeat them, so suffix trees over earlier outputs draft well.
Modes: off, always on, threshold_4 (on while at most 4 requests run) and adaptive (the learned
gate: at each load, the side that measured more tokens per second). Each mode gets its own
engine (the real vLLM engine, real speculation), the same requests and the same order; a mode's
first pass warms its suffix cache, as earlier iterations would, and is not timed.

- low load: `--low` requests at a time (a few long generations), `--rounds` rounds;
- high load: `--high` requests at once, `--high-rounds` rounds.

The three modes run one after another, `--repeats` times; each ratio is taken against the same
repeat's "off" and reported as the median with its range.

Run: .venv/bin/python benchmarks/suffix_decoding.py [--low 2] [--high 64] [--rounds 6]
[--high-rounds 20] [--repeats 3] [--smoke] (writes results/suffix_decoding.json and
suffix_decoding.md beside this file; --smoke: a smaller fine-tune and load, one repeat, nothing
written)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from report import save
from rich.console import Console
from rich.table import Table

from rollart.config import EngineConfig, SpeculationConfig
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import resolve_model_path

console = Console()
RESPONSE_TOKENS = 64
PROMPTS = 8
MODES = {"off": None, "always_on": SpeculationConfig(max_running_requests=None),
         "threshold_4": SpeculationConfig(max_running_requests=4),
         "adaptive": SpeculationConfig(max_running_requests="learned")}


def low_entropy_policy(out: Path, steps: int, seed: int = 0) -> tuple[Path, list[list[int]]]:
    """The tiny model fine-tuned to answer each prompt with its own fixed response; the
    prompts' token ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = resolve_model_path(None)
    shutil.copytree(base, out, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    rng = random.Random(seed)
    vocab = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.all_special_ids]
    prompts = [[rng.choice(vocab) for _ in range(12)] for _ in range(PROMPTS)]
    responses = [[rng.choice(vocab) for _ in range(RESPONSE_TOKENS)] for _ in range(PROMPTS)]
    batch = torch.tensor([p + r for p, r in zip(prompts, responses, strict=True)])
    labels = batch.clone()
    labels[:, :len(prompts[0])] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    console.print(f"fine-tuned policy: loss {loss.item():.3f} per response token")
    return out, prompts


async def serve(engine: PolicyEngine, prompts: list[list[int]], concurrency: int,
                requests: int) -> tuple[int, float]:
    """(tokens, seconds) for `requests` requests, `concurrency` at a time."""
    tokens, started = 0, time.perf_counter()
    for first in range(0, requests, concurrency):
        outs = await asyncio.gather(*[
            engine.generate(prompts[k % len(prompts)], max_tokens=RESPONSE_TOKENS,
                            temperature=1.0, ignore_eos=True)
            for k in range(first, min(first + concurrency, requests))])
        tokens += sum(len(o.token_ids) for o in outs)
    return tokens, time.perf_counter() - started


async def measure(model: Path, prompts: list[list[int]], mode: str, low: int, high: int,
                  rounds: int, high_rounds: int) -> dict:
    engine = await PolicyEngine(str(model), EngineConfig(), speculation=MODES[mode]).start()
    try:
        await serve(engine, prompts, high, high * 4)  # warm-up: earlier iterations' outputs
        before, switch_s = await engine.speculation_counters(), engine.switch_s
        low_tokens, low_s = await serve(engine, prompts, low, low * rounds)
        high_tokens, high_s = await serve(engine, prompts, high, high * high_rounds)
        after = await engine.speculation_counters()
        gate_rates, switch_s = engine.gate.rates(), engine.switch_s - switch_s
    finally:
        engine.shutdown()
    result = {"low_load_tokens_per_s": low_tokens / low_s,
              "high_load_tokens_per_s": high_tokens / high_s}
    if after is not None:
        drafted = after["draft_tokens"] - before["draft_tokens"]
        accepted = after["accepted_tokens"] - before["accepted_tokens"]
        steps = after["verify_steps"] - before["verify_steps"]
        result.update(acceptance_rate=accepted / drafted if drafted else 0.0,
                      mean_accepted_length=1 + accepted / steps if steps else 0.0,
                      switches=after["switches"] - before["switches"])
        if result["switches"]:
            result["switch_ms"] = 1000 * switch_s / result["switches"]
    if gate_rates:
        result["gate_tokens_per_s"] = gate_rates  # '<load bucket>:<side>', as it learned them
    return result


RATIOS = {"low_load_speedup_adaptive": ("adaptive", "low_load_tokens_per_s"),
          "low_load_speedup_always_on": ("always_on", "low_load_tokens_per_s"),
          "high_load_ratio_adaptive_vs_off": ("adaptive", "high_load_tokens_per_s"),
          "high_load_ratio_always_on_vs_off": ("always_on", "high_load_tokens_per_s"),
          "low_load_speedup_threshold_4": ("threshold_4", "low_load_tokens_per_s"),
          "high_load_ratio_threshold_4_vs_off": ("threshold_4", "high_load_tokens_per_s")}


async def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="rollart-suffix-") as tmp:
        model, prompts = low_entropy_policy(Path(tmp) / "policy", args.finetune_steps)
        repeats = []
        for repeat in range(args.repeats):
            modes = {}
            for mode in MODES:
                modes[mode] = await measure(model, prompts, mode, args.low, args.high,
                                            args.rounds, args.high_rounds)
                console.print(f"repeat {repeat}, {mode}: {modes[mode]}")
            repeats.append(modes)
    results: dict = {}
    for key, (mode, figure) in RATIOS.items():
        ratios = sorted(r[mode][figure] / r["off"][figure] for r in repeats)
        results[key] = statistics.median(ratios)
        results[key + "_range"] = [ratios[0], ratios[-1]]
    on = [r["always_on"] for r in repeats]
    results.update(
        acceptance_rate=statistics.median(m["acceptance_rate"] for m in on),
        mean_accepted_length=statistics.median(m["mean_accepted_length"] for m in on),
        adaptive_switches=[r["adaptive"]["switches"] for r in repeats],
        threshold_4_switches=[r["threshold_4"]["switches"] for r in repeats],
        repeats=repeats,
        workload={"prompts": PROMPTS, "response_tokens": RESPONSE_TOKENS, "low": args.low,
                  "high": args.high, "rounds": args.rounds, "high_rounds": args.high_rounds,
                  "repeats": args.repeats,
                  "finetune_steps": args.finetune_steps})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--low", type=int, default=2)
    parser.add_argument("--high", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--high-rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--finetune-steps", type=int, default=150)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.low, args.high, args.rounds, args.finetune_steps, args.repeats = 1, 8, 1, 5, 1
        args.high_rounds = 1
    results = asyncio.run(run(args))
    table = Table(title="SuffixDecoding: tokens/s over speculation off (median of repeats, "
                  "range)")
    for column in ("mode", "low load vs off", "high load vs off", "acceptance",
                   "mean accepted length"):
        table.add_column(column, justify="right")
    rows = []
    for mode in ("always_on", "threshold_4", "adaptive"):
        low_key = f"low_load_speedup_{mode}"
        high_key = f"high_load_ratio_{mode}_vs_off"
        figures = [r[mode] for r in results["repeats"]]
        rows.append([mode, _ratio(results, low_key), _ratio(results, high_key),
                     f"{statistics.median(f['acceptance_rate'] for f in figures):.2f}",
                     f"{statistics.median(f['mean_accepted_length'] for f in figures):.2f}"])
        table.add_row(*rows[-1])
    console.print(table)
    off = [r["off"] for r in results["repeats"]]
    off_line = (f"Off: {statistics.median(f['low_load_tokens_per_s'] for f in off):.0f} tokens/s "
                f"at low load, {statistics.median(f['high_load_tokens_per_s'] for f in off):.0f} "
                "at high load (medians).")
    console.print(off_line)
    if args.smoke:
        return
    save("suffix_decoding", results, "SuffixDecoding in rollout",
         f".venv/bin/python benchmarks/suffix_decoding.py --repeats {args.repeats}",
         ["System figures of the real engine (vLLM, CPU) on a low-entropy tiny policy; see the "
          "script's docstring for the workload.", "",
          "| mode | low load vs off | high load vs off | acceptance | mean accepted length |",
          "|---|---:|---:|---:|---:|", *("| " + " | ".join(row) + " |" for row in rows), "",
          off_line, f"Switches per repeat: threshold_4 (speculates while at most 4 requests "
          f"run) {results['threshold_4_switches']}; adaptive (the learned gate, "
          f"rollart/policy/speculation_gate.py) {results['adaptive_switches']}. A switch "
          f"(one call into the engine core, answered between two steps), mean ms per repeat: "
          f"{_switch_ms(results['repeats'])}.", "",
          "What the adaptive gate measured, tokens/s by load bucket (requests running: 0 is 1, "
          "1 is 2, 2 is 3-4, 3 is 5-8, 6 is 33-64) and side, each repeat:", "",
          *(f"- { {k: round(v) for k, v in r['adaptive'].get('gate_tokens_per_s', {}).items()} }"
            for r in results["repeats"])])


def _switch_ms(repeats: list[dict]) -> str:
    return "; ".join(f"{mode} " + ", ".join(f"{r[mode].get('switch_ms', 0):.1f}" for r in repeats)
                     for mode in ("threshold_4", "adaptive"))


def _ratio(results: dict, key: str) -> str:
    low, high = results[key + "_range"]
    return f"{results[key]:.2f} ({low:.2f}-{high:.2f})"


if __name__ == "__main__":
    main()
