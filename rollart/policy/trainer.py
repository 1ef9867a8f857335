"""The training side of the policy: a torch model that takes GRPO steps on stored trajectories;
its weights go out as named tensors (to the weight store) and its checkpoints to a blob store."""

from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from rollart.blobs import BlobStore
from rollart.config import AlgorithmConfig
from rollart.contracts import TrainResult, TrainSample
from rollart.policy.grpo import (
    Correction,
    Scored,
    clipped_policy_loss,
    group_advantages,
    off_policy_correction,
    token_logprobs,
)
from rollart.store import TrajectoryStore, TurnRecord


@dataclass
class Sequence:
    """One trajectory laid out for the trainer, token-in/token-out."""

    token_ids: list[int]
    loss_mask: list[bool]
    behaviour_logprobs: list[float]
    versions: list[int]
    allowed_ids: list[int] | None
    advantage: float


def layout(records: list[TurnRecord], advantage: float) -> Sequence:
    """Concatenate turns exactly as the engine saw them; only sampled tokens are trained."""
    ids, mask, behaviour, versions = [], [], [], []
    allowed = None
    for record in records:
        ids += record.observation_ids
        mask += [False] * len(record.observation_ids)
        behaviour += [0.0] * len(record.observation_ids)
        versions += [-1] * len(record.observation_ids)
        ids += record.sampled_ids
        mask += [True] * len(record.sampled_ids)
        behaviour += record.logprobs
        versions += record.versions
        allowed = record.allowed_ids if record.allowed_ids is not None else allowed
    return Sequence(ids, mask, behaviour, versions, allowed, advantage)


@dataclass
class _Batch:
    """One minibatch as tensors; positions are shifted so index t predicts token t+1."""

    ids: torch.Tensor
    attention: torch.Tensor
    mask: torch.Tensor
    behaviour: torch.Tensor
    advantages: torch.Tensor
    allowed: torch.Tensor | None
    old: torch.Tensor | None = None
    correction: Correction | None = None


class Trainer:
    def __init__(self, model_path: str, learning_rate: float, seed: int = 0,
                 threads: int | None = None) -> None:
        torch.set_num_threads(threads or max((os.cpu_count() or 2) // 2, 1))
        self.model_path, self.learning_rate, self.seed = model_path, learning_rate, seed
        self.reset()

    def reset(self) -> None:
        """Back to the configured model with a fresh optimizer, as a new run expects."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(self.seed)
        self.rng = random.Random(self.seed)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        self.model.train()
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.vocab_size = self.model.config.vocab_size
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.learning_rate,
                                           weight_decay=0.0)
        self.version = 0

    def train_step(self, store: TrajectoryStore, samples: list[TrainSample],
                   algorithm: AlgorithmConfig, temperature: float,
                   heartbeat: Callable[[], None] = lambda: None) -> TrainResult:
        started = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = algorithm.learning_rate
        advantages = group_advantages(
            [Scored(s.trajectory_id, s.group_id, s.reward) for s in samples]
        )
        by_group: dict[str, list[Sequence]] = {}
        for sample in samples:
            records = store.read(sample.trajectory_id, sample.turns)
            if not records:
                raise ValueError(f"trajectory {sample.trajectory_id} has no stored turns")
            by_group.setdefault(sample.group_id, []).append(
                layout(records, advantages[sample.trajectory_id])
            )
        groups = list(by_group.values())
        self.rng.shuffle(groups)
        chunks = [groups[i::algorithm.minibatches] for i in range(algorithm.minibatches)]
        batches = [self._tensors([seq for group in chunk for seq in group], temperature)
                   for chunk in chunks if chunk]

        # The old policy is this step's starting point; correct from the engine's behaviour
        # policy to it before any update.
        with torch.no_grad():
            for batch in batches:
                batch.old = self._logprobs(batch, temperature)
                batch.correction = off_policy_correction(
                    batch.old, batch.behaviour, batch.mask, algorithm.tis_cap,
                    algorithm.sequence_mask_threshold)
        heartbeat()

        losses, clip_fractions, tokens, grad_norm = [], [], 0, 0.0
        for batch in batches:
            stats = clipped_policy_loss(self._logprobs(batch, temperature), batch.old,
                                        batch.advantages, batch.mask, algorithm.clip_eps,
                                        weights=batch.correction.weights)
            self.optimizer.zero_grad(set_to_none=True)
            stats.loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                             algorithm.max_grad_norm))
            self.optimizer.step()
            losses.append(float(stats.loss.detach()))
            clip_fractions.append(stats.clip_fraction)
            tokens += stats.tokens
            heartbeat()

        sequences = [seq for group in groups for seq in group]
        sampled_versions = [[v for v, m in zip(s.versions, s.loss_mask, strict=True) if m]
                            for s in sequences]
        sampled = max(sum(len(v) for v in sampled_versions), 1)
        stale = sum(v < self.version for versions in sampled_versions for v in versions)
        weight = [b.mask.sum().item() for b in batches]

        def token_mean(field: str) -> float:
            total = sum(weight) or 1
            return sum(getattr(b.correction, field) * w for b, w in zip(batches, weight,
                                                                        strict=True)) / total

        self.version += 1
        return TrainResult(
            version=self.version,
            loss=sum(losses) / max(len(losses), 1),
            grad_norm=grad_norm,
            clip_fraction=sum(clip_fractions) / max(len(clip_fractions), 1),
            trained_tokens=tokens,
            logprob_mismatch=token_mean("mismatch"),
            ratio_mean=token_mean("ratio_mean"),
            ratio_max=max((b.correction.ratio_max for b in batches), default=0.0),
            kl_estimate=token_mean("kl_estimate"),
            masked_sequences=sum(b.correction.masked_sequences for b in batches),
            stale_token_share=stale / sampled,
            mixed_version_sequences=sum(len(set(v)) > 1 for v in sampled_versions),
            seconds=time.perf_counter() - started,
        )

    def _tensors(self, sequences: list[Sequence], temperature: float) -> _Batch:
        length = max(len(s.token_ids) for s in sequences)

        def pad(values, fill):
            return [v + [fill] * (length - len(v)) for v in values]

        allowed = None
        if any(s.allowed_ids is not None for s in sequences):
            allowed = torch.ones(len(sequences), self.vocab_size, dtype=torch.bool)
            for row, seq in enumerate(sequences):
                if seq.allowed_ids is not None:
                    allowed[row] = False
                    allowed[row, seq.allowed_ids] = True
        return _Batch(
            ids=torch.tensor(pad([s.token_ids for s in sequences], self.pad_id)),
            attention=torch.tensor(pad([[1] * len(s.token_ids) for s in sequences], 0)),
            mask=torch.tensor(pad([s.loss_mask for s in sequences], False))[:, 1:],
            behaviour=torch.tensor(pad([s.behaviour_logprobs for s in sequences], 0.0))[:, 1:],
            advantages=torch.tensor([s.advantage for s in sequences])[:, None],
            allowed=allowed,
        )

    def _logprobs(self, batch: _Batch, temperature: float) -> torch.Tensor:
        logits = self.model(input_ids=batch.ids, attention_mask=batch.attention).logits[:, :-1]
        return token_logprobs(logits, batch.ids[:, 1:], temperature, batch.allowed)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights an engine loads, by checkpoint name (a tied lm_head appears once, as the
        embeddings)."""
        for name, parameter in self.model.named_parameters():
            yield name, parameter.detach()

    def save_checkpoint(self, blobs: BlobStore, prefix: str) -> str:
        """Model and optimizer at this version, then a pointer to it; returns the key prefix."""
        where = f"{prefix}/v{self.version:06d}"
        blobs.put(f"{where}/model.safetensors", save_safetensors(
            {name: tensor.contiguous() for name, tensor in self.named_weights()}))
        buffer = io.BytesIO()
        torch.save({"optimizer": self.optimizer.state_dict(), "version": self.version}, buffer)
        blobs.put(f"{where}/trainer.pt", buffer.getvalue())
        blobs.put(f"{prefix}/latest", str(self.version).encode())
        return where

    def load_checkpoint(self, blobs: BlobStore, prefix: str,
                        version: int | None = None) -> int | None:
        """Restore the checkpoint of `version` (default: the newest) under `prefix`; its
        version, or None if there is none."""
        if version is None:
            latest = blobs.get(f"{prefix}/latest")
            if latest is None:
                return None
            version = int(latest)
        where = f"{prefix}/v{version:06d}"
        model, state = blobs.get(f"{where}/model.safetensors"), blobs.get(f"{where}/trainer.pt")
        if model is None and state is None:
            return None
        if model is None or state is None:
            raise FileNotFoundError(f"checkpoint {where} is incomplete")
        saved = torch.load(io.BytesIO(state), weights_only=True)
        self.load_weights(load_safetensors(model).items(), saved["version"])
        self.optimizer.load_state_dict(saved["optimizer"])
        return self.version

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Take these weights (every trainable tensor, by name) as `version`."""
        named = dict(tensors)
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                if name not in named:
                    raise KeyError(f"weights of version {version} lack {name}")
                parameter.copy_(named[name])
        self.version = version
