"""The torch trainer over several data-parallel ranks, sharded with FSDP2: each rank holds 1/N
of the weights, gradients and optimizer state and takes the gradient of 1/N of every minibatch.

Rank 0 lives in the train worker and serves its activities; it starts the other ranks as
processes and has them follow every call that needs all ranks (the call and its arguments go
out as one broadcast, then every rank runs the same method). Every rank holds the whole batch,
so the passes without a gradient (pre-step logprobs, the step's KL) and every decision taken on
them agree across ranks without further traffic; only the gradient pass is split by rows, its
loss divided by the whole minibatch's normalizer so the ranks' gradients average to the
single-process one.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rollart.config import AlgorithmConfig
from rollart.contracts import TrainResult
from rollart.policy.grpo import LossStats, clipped_policy_loss, loss_normalizer
from rollart.policy.trainer import KlSums, Sequence, Trainer, _Batch, add_k3_sums
from rollart.policy.vllm_plugin import exit_with

COLLECTIVE_TIMEOUT = timedelta(minutes=10)


class RankFailed(RuntimeError):
    """A follower rank is gone: the trainer's collectives cannot go on."""


class ShardedTrainer(Trainer):
    def __init__(self, model_path: str, learning_rate: float, seed: int = 0,
                 threads: int | None = None, device: str = "cpu", ranks: int = 2) -> None:
        if ranks < 2:
            raise ValueError(f"trainer.ranks: a sharded trainer needs 2 ranks or more, not "
                             f"{ranks}")
        if device == "cuda" and torch.cuda.device_count() < ranks:
            raise ValueError(f"trainer.ranks: {ranks} ranks need {ranks} CUDA devices; this "
                             f"machine has {torch.cuda.device_count()}")
        self.rank, self.ranks = 0, ranks
        self._rendezvous = Path(tempfile.mkdtemp(prefix="rollart-ranks-"))
        context = mp.get_context("spawn")
        self.followers = [
            context.Process(target=_follow, name=f"rollart-trainer-rank{rank}", daemon=True,
                            args=(rank, ranks, str(self._rendezvous), os.getpid(), model_path,
                                  learning_rate, seed, threads, device))
            for rank in range(1, ranks)]
        for follower in self.followers:
            follower.start()
        _join(0, ranks, self._rendezvous, device)
        super().__init__(model_path, learning_rate, seed, threads, _rank_device(device, 0))

    @classmethod
    def _follower(cls, rank: int, ranks: int, model_path: str, learning_rate: float,
                  seed: int, threads: int | None, device: str) -> ShardedTrainer:
        """A rank other than 0: the same trainer, without a model until rank 0's first call
        (a reset) reaches it."""
        follower = cls.__new__(cls)
        follower.rank, follower.ranks, follower.followers = rank, ranks, []
        torch.set_num_threads(threads or max((os.cpu_count() or 2) // 2, 1))
        follower.model_path, follower.learning_rate, follower.seed = (model_path,
                                                                      learning_rate, seed)
        follower.device = torch.device(_rank_device(device, rank))
        return follower

    def close(self) -> None:
        """Stop the follower ranks and leave the process group."""
        if self.rank == 0 and any(f.is_alive() for f in self.followers):
            self._tell("stop")
            for follower in self.followers:
                follower.join(timeout=30)
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(getattr(self, "_rendezvous", ""), ignore_errors=True)

    def _tell(self, method: str, *args: object) -> None:
        """From rank 0: every follower runs `method(*args)` now, as rank 0 is about to."""
        if self.rank != 0:
            return
        for rank, follower in enumerate(self.followers, start=1):
            if not follower.is_alive():
                raise RankFailed(f"trainer rank {rank} is gone (exit code {follower.exitcode}); "
                                 "restart the train worker")
        dist.broadcast_object_list([(method, args)], src=0)

    def follow(self) -> None:
        """On a follower: run rank 0's calls until it says stop."""
        while True:
            message: list[object] = [None]
            dist.broadcast_object_list(message, src=0)
            method, args = message[0]
            if method == "stop":
                return
            getattr(self, method)(*args)

    def reset(self) -> None:
        self._tell("reset")
        super().reset()

    def _place_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        self.model.to(self.device)
        for layer in getattr(getattr(self.model, "model", None), "layers", []):
            fully_shard(layer)  # one all-gather per layer, not one for the whole model
        fully_shard(self.model)

    def _parameters(self) -> list[torch.nn.Parameter]:
        """The shards. After a forward pass without a gradient FSDP2 leaves the root's weights
        (embeddings, final norm) gathered whole, and a write to those is lost at the next
        reshard."""
        self.model.reshard()
        return list(self.model.parameters())

    def _train_groups(self, groups: list[list[Sequence]], algorithm: AlgorithmConfig,
                      temperature: float,
                      heartbeat: Callable[[], None] = lambda: None) -> TrainResult:
        self._tell("_train_groups", groups, algorithm, temperature)
        return super()._train_groups(groups, algorithm, temperature, heartbeat)

    def _backward(self, batch: _Batch, algorithm: AlgorithmConfig, temperature: float,
                  entropy_coef: float) -> LossStats:
        """This rank's rows of the minibatch; each rank's loss is its share of the whole
        minibatch's (FSDP averages the ranks' gradients, hence the factor `ranks`)."""
        rows = batch.ids.shape[0]
        mine = list(range(self.rank, rows, self.ranks))
        part = batch.rows(mine or [0])
        if not mine:  # fewer rows than ranks: a row that counts for nothing keeps step
            part.mask = torch.zeros_like(part.mask)
        normalizer = loss_normalizer(batch.mask, batch.advantages, algorithm.loss_aggregation)
        tokens = max(float(batch.mask.sum()), 1.0)
        logprobs, token_entropy = self._logprobs(part, temperature)
        stats = clipped_policy_loss(logprobs, part.old, part.advantages, part.mask,
                                    algorithm.clip_eps, weights=part.correction.weights,
                                    aggregation=algorithm.loss_aggregation,
                                    clip_eps_high=algorithm.clip_eps_high,
                                    normalizer=normalizer)
        loss = stats.loss
        if entropy_coef:
            loss = loss - entropy_coef * (token_entropy * part.mask).sum() / tokens
        (loss * self.ranks).backward()
        totals = torch.tensor([float(stats.loss.detach()),
                               stats.clip_fraction * max(stats.tokens, 1)], device=self.device)
        dist.all_reduce(totals)
        return LossStats(totals[0], float(totals[1]) / tokens, int(batch.mask.sum()))

    def _pre_step(self, batch: _Batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Each rank computes its rows; every rank gets the whole minibatch's."""
        rows = batch.ids.shape[0]
        share = -(-rows // self.ranks)
        mine = list(range(self.rank, rows, self.ranks))
        logprobs, entropies = self._logprobs(batch.rows(mine or [0]), temperature)
        both = torch.stack([logprobs, entropies])
        padded = torch.zeros(2, share, both.shape[-1], dtype=both.dtype, device=both.device)
        padded[:, :len(mine)] = both[:, :len(mine)]
        gathered = [torch.empty_like(padded) for _ in range(self.ranks)]
        dist.all_gather(gathered, padded)
        whole = torch.empty(2, rows, both.shape[-1], dtype=both.dtype, device=both.device)
        for rank, part in enumerate(gathered):
            count = len(range(rank, rows, self.ranks))
            whole[:, rank::self.ranks] = part[:, :count]
        return whole[0], whole[1]

    def _step_kl_sums(self, batches: list[_Batch], temperature: float) -> KlSums:
        """Summed over the ranks' rows: every rank gets the same figures, so the trust region's
        pull-back loop runs the same number of times everywhere."""
        domains = sorted({d for batch in batches for d in (batch.domains or ("",))})
        sums: KlSums = {}
        with torch.no_grad():
            for batch in batches:
                mine = list(range(self.rank, batch.ids.shape[0], self.ranks))
                if not mine:
                    self._logprobs(batch.rows([0]), temperature)  # the all-gathers still run
                    continue
                part = batch.rows(mine)
                add_k3_sums(sums, self._logprobs(part, temperature)[0], part)
        totals = torch.tensor([sums.get(d, (0.0, 0.0)) for d in domains], dtype=torch.float64,
                              device=self.device)
        dist.all_reduce(totals)
        return {d: (float(summed), float(count)) for d, (summed, count)
                in zip(domains, totals.tolist(), strict=True)}

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._tell("named_weights")
        self.model.reshard()
        return iter([(name, parameter.full_tensor().detach().to("cpu"))
                     for name, parameter in self.model.named_parameters()])

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]] | None,
                     version: int) -> None:
        """Rank 0 holds the whole tensors; each rank keeps its shard of them."""
        from torch.distributed.tensor import distribute_tensor

        named = None if tensors is None else dict(tensors)
        if named is not None:
            missing = [n for n, _ in self.model.named_parameters() if n not in named]
            if missing:
                raise KeyError(f"weights of version {version} lack {missing[0]}")
        self._tell("load_weights", None, version)
        self.model.reshard()
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                whole = (torch.empty(parameter.shape, dtype=parameter.dtype) if named is None
                         else named[name].to(parameter.dtype))
                parameter.copy_(distribute_tensor(whole.to(self.device),
                                                  parameter.device_mesh, parameter.placements))
        self.version = version

    def _optimizer_state(self) -> dict:
        self._tell("_optimizer_state")
        return super()._optimizer_state()

    def _load_optimizer_state(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        if self.rank == 0 and all(isinstance(key, int) for key in state["state"]):
            raise ValueError("this checkpoint's optimizer state is keyed by position (saved "
                             "before names were kept); a sharded trainer cannot resume it")
        self._tell("_load_optimizer_state", {})
        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))


def _rank_device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device == "cuda" else device


def _join(rank: int, ranks: int, rendezvous: Path, device: str) -> None:
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{rendezvous / 'store'}", rank=rank,
                            world_size=ranks, timeout=COLLECTIVE_TIMEOUT)


def _follow(rank: int, ranks: int, rendezvous: str, parent: int, model_path: str,
            learning_rate: float, seed: int, threads: int | None, device: str) -> None:
    exit_with(parent, role=f"trainer rank {rank}", parent_role="train worker")
    try:
        _join(rank, ranks, Path(rendezvous), device)
        ShardedTrainer._follower(rank, ranks, model_path, learning_rate, seed, threads,
                                 device).follow()
        dist.destroy_process_group()
    except BaseException:
        print(f"rollart: trainer rank {rank} failed:", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
