"""Moving weights to the inference fleet: synchronous vs overlapped pull, and the store's speed.

For each size (the tiny policy's real weights, then synthetic weights up to several GB) the
trainer side publishes the version through the Mooncake store (buckets + manifest, the code the
trainer runs), and a replica takes it two ways while a generation loop runs beside it:

- synchronous: suspend generation, pull, load, resume: the whole pull is exposed;
- overlapped (what rollart does): pull while generation goes on, then suspend only to load.

Exposed pull is the generation time lost to pulling: for the synchronous path the pull itself,
for the overlapped one the slowdown generation suffered while the pull ran beside it (measured
against its speed alone). hidden_pull_fraction = 1 - exposed (overlapped) / pull (synchronous).
Store throughput (push and verified pull, GB/s) is compared with a plain memory copy of the same
bytes in the same run. "Load" copies the pulled tensors into the replica's own (preallocated)
parameters, as an engine's in-place reload does.

Run: .venv/bin/python benchmarks/weight_transfer.py [--max-gb 2] [--bucket-mib 64] [--smoke]
(writes results/weight_transfer.json and weight_transfer.md beside this file; --smoke: the tiny
policy and 0.25 GB, nothing written)
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import torch
from report import save
from rich.console import Console
from rich.table import Table

from rollart.policy.model import resolve_model_path
from rollart.servers import free_port
from rollart.weights import MooncakeBackend, MooncakeMaster, Publisher, Puller, unpack

console = Console()
CHUNK = 64 << 20


def synthetic(total_bytes: int) -> dict[str, torch.Tensor]:
    tensors, left, index = {}, total_bytes, 0
    while left > 0:
        size = min(CHUNK, left)
        tensors[f"layers.{index}.weight"] = torch.empty(size // 4, dtype=torch.float32).uniform_()
        left -= size
        index += 1
    return tensors


def tiny_policy() -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(None))
    return {name: p.detach().clone() for name, p in model.named_parameters()}


class Generation:
    """A stand-in decode loop: fixed-size matmuls, each a 'step', pausable like an engine."""

    def __init__(self) -> None:
        self.steps = 0
        self.running = threading.Event()
        self.running.set()
        self.stop = False
        self.weight = torch.randn(512, 512)
        self.state = torch.randn(16, 512)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop:
            self.running.wait()
            self.state = torch.tanh(self.state @ self.weight)
            self.steps += 1

    def rate(self, seconds: float) -> float:
        start, began = self.steps, time.perf_counter()
        time.sleep(seconds)
        return (self.steps - start) / (time.perf_counter() - began)


def load_into(params: dict[str, torch.Tensor], blobs: list[bytes]) -> None:
    for name, tensor in unpack(blobs):
        params[name].copy_(tensor)


def measure(size_label: str, tensors: dict[str, torch.Tensor], publisher: Publisher,
            puller: Puller, generation: Generation, version: int) -> dict:
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    params = {name: torch.empty_like(t) for name, t in tensors.items()}

    started = time.perf_counter()
    copies = [t.clone() for t in tensors.values()]
    memcpy_s = time.perf_counter() - started
    del copies

    manifest, push = publisher.publish(version, tensors.items())

    # synchronous: generation suspended for pull + load
    generation.running.clear()
    started = time.perf_counter()
    blobs, pull = puller.pull(manifest)
    pulled = time.perf_counter()
    load_into(params, blobs)
    sync_exposed = time.perf_counter() - started
    generation.running.set()
    sync_load = time.perf_counter() - pulled
    assert all(torch.equal(params[n], tensors[n]) for n in tensors)
    del blobs

    # overlapped: pull beside a running generation loop, suspend only to load
    baseline = generation.rate(0.5)
    before = generation.steps
    started = time.perf_counter()
    blobs, pull_overlapped = puller.pull(manifest)
    pull_window = time.perf_counter() - started
    during = (generation.steps - before) / pull_window
    generation.running.clear()
    suspended = time.perf_counter()
    load_into(params, blobs)
    overlapped_exposed_load = time.perf_counter() - suspended
    generation.running.set()
    del blobs
    lost_to_pull = pull_window * max(0.0, 1 - during / baseline)
    return {
        "size": size_label, "bytes": total, "buckets": len(manifest.buckets),
        "push_s": push.seconds, "pull_s_sync": pull.seconds, "load_s": sync_load,
        "exposed_s_sync": sync_exposed, "pull_s_overlapped": pull_overlapped.seconds,
        "exposed_s_overlapped": overlapped_exposed_load + lost_to_pull,
        "exposed_pull_s_sync": pull.seconds, "exposed_pull_s_overlapped": lost_to_pull,
        "generation_speed_during_pull": during / baseline,
        "hidden_pull_fraction": 1 - lost_to_pull / pull.seconds,
        "push_gbps": total / push.seconds / 1e9, "pull_gbps": total / pull.seconds / 1e9,
        "memcpy_gbps": total / memcpy_s / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-gb", type=float, default=2.0)
    parser.add_argument("--bucket-mib", type=float, default=64)
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    args = parser.parse_args()
    if args.smoke:
        args.max_gb = 0.25
    sizes = [("tiny policy", None)] + [(f"{gb:g} GB", gb) for gb in (0.25, 1, 2, 4, 8)
                                       if gb <= args.max_gb]
    largest = max(gb for _, gb in sizes if gb) if any(gb for _, gb in sizes) else 0
    segment_mib = int(largest * 1024 * 1.3) + 256
    log = Path(tempfile.gettempdir()) / "rollart-bench-mooncake.log"
    rows = []
    with MooncakeMaster(free_port(), log) as master:
        trainer_side = MooncakeBackend(master.address, segment_mib=segment_mib, buffer_mib=256)
        replica_side = MooncakeBackend(master.address, segment_mib=64, buffer_mib=256)
        publisher = Publisher(trainer_side, None, "bench", args.bucket_mib)
        puller = Puller(replica_side)
        generation = Generation()
        generation.thread.start()
        try:
            for version, (label, gb) in enumerate(sizes):
                with console.status(f"{label}: publish, pull twice, load"):
                    tensors = tiny_policy() if gb is None else synthetic(int(gb * 2**30))
                    rows.append(measure(label, tensors, publisher, puller, generation, version))
                    del tensors
                    publisher.retire(keep_from=version + 1)
                console.print(f"{label}: done")
        finally:
            generation.stop = True
            generation.running.set()
            trainer_side.close()
            replica_side.close()

    table = Table(title=f"weight transfer through the Mooncake store (buckets of "
                        f"{args.bucket_mib:g} MiB, TCP on loopback)")
    columns = ["size", "push s", "pull s", "load s", "exposed s sync", "exposed s overlapped",
               "hidden pull", "gen speed during pull", "push GB/s", "pull GB/s", "memcpy GB/s"]
    for column in columns:
        table.add_column(column, justify="right")
    md = []
    for r in rows:
        cells = [r["size"], f"{r['push_s']:.3f}", f"{r['pull_s_sync']:.3f}",
                 f"{r['load_s']:.3f}", f"{r['exposed_s_sync']:.3f}",
                 f"{r['exposed_s_overlapped']:.3f}", f"{r['hidden_pull_fraction']:.2f}",
                 f"{r['generation_speed_during_pull']:.2f}", f"{r['push_gbps']:.2f}",
                 f"{r['pull_gbps']:.2f}", f"{r['memcpy_gbps']:.2f}"]
        table.add_row(*cells)
        md.append("| " + " | ".join(cells) + " |")
    console.print(table)
    big = rows[-1]
    results = {
        "hidden_pull_fraction": big["hidden_pull_fraction"],
        "exposed_pull_s_largest": big["exposed_pull_s_overlapped"],
        "exposed_pull_s_largest_sync": big["exposed_pull_s_sync"],
        "store_gbps": big["pull_gbps"],
        "store_push_gbps": big["push_gbps"],
        "memcpy_gbps": big["memcpy_gbps"],
        "largest": big["size"],
        "rows": rows,
        "bucket_mib": args.bucket_mib,
    }
    if args.smoke:
        return
    save("weight_transfer", results, "Weight transfer: synchronous vs overlapped pull",
         "python benchmarks/weight_transfer.py"
         + (f" --max-gb {args.max_gb:g}" if args.max_gb != 2 else ""),
         [table.title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
          *md, "", "Exposed = generation time lost to the update; overlapped exposed = load "
          "+ the generation slowdown while the pull ran beside it. hidden pull = 1 - "
          "(generation time lost to pulling, overlapped) / (pull time, synchronous)."])


if __name__ == "__main__":
    main()
