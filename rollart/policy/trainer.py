"""The training side of the policy: a torch model that takes GRPO steps on stored trajectories;
its weights go out as named tensors (to the weight store) and its checkpoints to a blob store."""

from __future__ import annotations

import io
import itertools
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from rollart.blobs import BlobStore
from rollart.config import AlgorithmConfig
from rollart.contracts import LearningStats, TrainResult, TrainSample
from rollart.policy.grpo import (
    Correction,
    LossStats,
    Scored,
    clipped_policy_loss,
    entropy,
    group_advantages,
    off_policy_correction,
    sampling_log_distribution,
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
    domain: str = ""

    @property
    def sampled_versions(self) -> list[int]:
        """The policy version of each sampled (trained) token."""
        return [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]


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
    old_entropy: torch.Tensor | None = None
    correction: Correction | None = None
    domains: tuple[str, ...] = ()

    def rows(self, index: list[int]) -> _Batch:
        """These rows of the batch, with the pre-step figures the loss needs."""
        def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[index]

        correction = (None if self.correction is None
                      else replace(self.correction, weights=self.correction.weights[index]))
        return _Batch(self.ids[index], self.attention[index], self.mask[index],
                      self.behaviour[index], self.advantages[index], pick(self.allowed),
                      pick(self.old), pick(self.old_entropy), correction,
                      tuple(self.domains[i] for i in index))


class Trainer:
    def __init__(self, model_path: str, learning_rate: float, seed: int = 0,
                 threads: int | None = None, device: str = "cpu") -> None:
        torch.set_num_threads(threads or max((os.cpu_count() or 2) // 2, 1))
        self.model_path, self.learning_rate, self.seed = model_path, learning_rate, seed
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Back to the configured model with a fresh optimizer, as a new run expects."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(self.seed)
        self.rng = random.Random(self.seed)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        self.model.train()
        self.vocab_size = self.model.config.vocab_size
        self._place_model()
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.learning_rate,
                                           weight_decay=0.0)
        self.version = 0
        self.adaptive_entropy_coef = 0.0

    def train_step(self, store: TrajectoryStore, samples: list[TrainSample],
                   algorithm: AlgorithmConfig, temperature: float,
                   heartbeat: Callable[[], None] = lambda: None) -> TrainResult:
        started = time.perf_counter()
        result = self._train_groups(read_groups(store, samples), algorithm, temperature,
                                    heartbeat)
        return result.model_copy(update={"seconds": time.perf_counter() - started})

    def _train_groups(self, groups: list[list[Sequence]], algorithm: AlgorithmConfig,
                      temperature: float,
                      heartbeat: Callable[[], None] = lambda: None) -> TrainResult:
        for group in self.optimizer.param_groups:
            group["lr"] = algorithm.learning_rate
        self.rng.shuffle(groups)
        chunks = [groups[i::algorithm.minibatches] for i in range(algorithm.minibatches)]
        batches = [self._tensors([seq for group in chunk for seq in group], temperature)
                   for chunk in chunks if chunk]

        # The old policy is this step's starting point; correct from the engine's behaviour
        # policy to it before any update.
        with torch.no_grad():
            for batch in batches:
                batch.old, batch.old_entropy = self._pre_step(batch, temperature)
                batch.correction = off_policy_correction(
                    batch.old, batch.behaviour, batch.mask, algorithm.tis_cap,
                    algorithm.sequence_mask_threshold)
        heartbeat()
        entropy_coef = self._entropy_coef(batches, algorithm)
        start = ([p.detach().clone() for p in self._parameters()]
                 if algorithm.target_kl is not None else None)

        losses, clip_fractions, tokens, grad_norm, stepped = [], [], 0, 0.0, False
        for epoch, batch in itertools.product(range(algorithm.epochs), batches):
            if not entropy_coef and not bool((batch.advantages != 0).any()):
                # No gradient: an optimizer step would still move every weight along Adam's
                # momentum (for ten steps and more after the last evidence), sharpening the
                # policy on no data at all.
                losses.append(0.0)
                clip_fractions.append(0.0)
                continue
            self.optimizer.zero_grad(set_to_none=True)
            stats = self._backward(batch, algorithm, temperature, entropy_coef)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                             algorithm.max_grad_norm))
            self.optimizer.step()
            stepped = True
            losses.append(float(stats.loss.detach()))
            clip_fractions.append(stats.clip_fraction)
            tokens += stats.tokens if epoch == 0 else 0  # the batch's tokens, once
            heartbeat()

        versions_by_group = [[s.sampled_versions for s in group] for group in groups]
        sampled_versions = [v for group in versions_by_group for v in group]
        sampled = max(sum(len(v) for v in sampled_versions), 1)
        stale = sum(v < self.version for versions in sampled_versions for v in versions)
        mean_lag = _mean_lag(versions_by_group, self.version)
        by_domain = algorithm.trust_region == "domain"
        sums, kept = (self._step_kl_sums(batches, temperature) if stepped else {}), 1.0
        if stepped and start is not None:
            budget = algorithm.target_kl / (1 + mean_lag) ** algorithm.target_kl_lag_power
            sums, kept = self._within_trust_region(batches, temperature, start, sums, budget,
                                                   by_domain)
        learning = learning_stats(batches, groups, versions_by_group, self.version, algorithm,
                                  step_kl(sums, by_domain), kept, grad_norm, entropy_coef,
                                  mean_lag)
        learning.step_kl_by_domain = {d: s / max(n, 1.0) for d, (s, n) in sums.items() if d}
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
            learning=learning,
            seconds=0.0,  # the caller's: it reads the batch too
        )

    def _backward(self, batch: _Batch, algorithm: AlgorithmConfig, temperature: float,
                  entropy_coef: float) -> LossStats:
        """The gradient of the minibatch's loss (and the entropy bonus), into `.grad`."""
        logprobs, token_entropy = self._logprobs(batch, temperature)
        stats = clipped_policy_loss(logprobs, batch.old, batch.advantages, batch.mask,
                                    algorithm.clip_eps, weights=batch.correction.weights,
                                    aggregation=algorithm.loss_aggregation,
                                    clip_eps_high=algorithm.clip_eps_high)
        loss = stats.loss
        if entropy_coef:
            loss = loss - entropy_coef * _masked_mean(token_entropy, batch.mask)
        loss.backward()
        return stats

    def _place_model(self) -> None:
        """Put the freshly loaded model where it trains, before its optimizer is made."""
        self.model.to(self.device)

    def _parameters(self) -> list[torch.nn.Parameter]:
        """The weights the optimizer steps, to read or set in place."""
        return list(self.model.parameters())

    def _entropy_coef(self, batches: list[_Batch], algorithm: AlgorithmConfig) -> float:
        """The entropy bonus's weight for this step. Under adaptive control (Skywork-OR1's) it
        follows the pre-step entropy against `entropy_target`: a policy that has turned nearly
        deterministic before it has found the reward stops exploring, and stale batches speed
        that collapse up."""
        if algorithm.entropy_target is None:
            return algorithm.entropy_coef
        below = _pre_step_entropy(batches) < algorithm.entropy_target
        change = algorithm.entropy_coef_step if below else -algorithm.entropy_coef_step
        self.adaptive_entropy_coef = max(self.adaptive_entropy_coef + change,
                                         algorithm.entropy_coef)
        return self.adaptive_entropy_coef

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
        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, device=self.device)

        return _Batch(
            ids=tensor(pad([s.token_ids for s in sequences], self.pad_id)),
            attention=tensor(pad([[1] * len(s.token_ids) for s in sequences], 0)),
            mask=tensor(pad([s.loss_mask for s in sequences], False))[:, 1:],
            behaviour=tensor(pad([s.behaviour_logprobs for s in sequences], 0.0))[:, 1:],
            advantages=tensor([s.advantage for s in sequences])[:, None],
            allowed=None if allowed is None else allowed.to(self.device),
            domains=tuple(s.domain for s in sequences),
        )

    def _logprobs(self, batch: _Batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Each next token's log-probability, and each position's entropy, under the sampling
        distribution of the current weights."""
        logits = self.logits(batch.ids, batch.attention)[:, :-1]
        log_p = sampling_log_distribution(logits, temperature, batch.allowed)
        return log_p.gather(-1, batch.ids[:, 1:].unsqueeze(-1)).squeeze(-1), entropy(log_p)

    def logits(self, ids: torch.Tensor, attention: torch.Tensor | None = None) -> torch.Tensor:
        """[rows, positions, vocab] logits of the current weights; `attention` marks the real
        tokens of rows padded at the end."""
        return self.model(input_ids=ids, attention_mask=attention).logits

    def _pre_step(self, batch: _Batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The old policy's logprobs and entropies on the minibatch (no gradient)."""
        return self._logprobs(batch, temperature)

    def _within_trust_region(self, batches: list[_Batch], temperature: float,
                             start: list[torch.Tensor], sums: KlSums, target_kl: float,
                             by_domain: bool, tries: int = 4) -> tuple[KlSums, float]:
        """Pull the weights back toward `start` along the step until the step's KL is within
        1.5x `target_kl`: Adam moves every weight by about the learning rate whatever the
        evidence, so one group's lucky success can move the policy as far as a batch full of
        signal. Returns the step's KL sums and the share of the step kept. (KL grows about with
        the square of the step, hence the square root; the optimizer's moments are left as they
        are.)"""
        kept = 1.0
        for _ in range(tries):
            kl = step_kl(sums, by_domain)
            if kl <= 1.5 * target_kl:
                break
            shrink = max((target_kl / kl) ** 0.5, 0.05)
            kept *= shrink
            with torch.no_grad():
                for parameter, before in zip(self._parameters(), start, strict=True):
                    parameter.copy_(before + shrink * (parameter - before))
            sums = self._step_kl_sums(batches, temperature)
        return sums, kept

    def _step_kl_sums(self, batches: list[_Batch], temperature: float) -> KlSums:
        """How far this step moved the policy, by domain: the k3 estimate of KL(pre-step ||
        post-step) summed over each domain's sampled tokens, and their number (one more forward
        pass)."""
        sums: KlSums = {}
        with torch.no_grad():
            for batch in batches:
                add_k3_sums(sums, self._logprobs(batch, temperature)[0], batch)
        return sums

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights an engine loads, by checkpoint name (a tied lm_head appears once, as the
        embeddings)."""
        for name, parameter in self.model.named_parameters():
            yield name, parameter.detach().to("cpu")

    def save_checkpoint(self, blobs: BlobStore, prefix: str) -> str:
        """Model and optimizer at this version, then a pointer to it; returns the key prefix."""
        where = f"{prefix}/v{self.version:06d}"
        blobs.put(f"{where}/model.safetensors", save_safetensors(
            {name: tensor.contiguous() for name, tensor in self.named_weights()}))
        buffer = io.BytesIO()
        torch.save({"optimizer": self._optimizer_state(), "version": self.version}, buffer)
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
        self._load_optimizer_state(saved["optimizer"])
        return self.version

    def _optimizer_state(self) -> dict:
        """The optimizer's state, whole and keyed by parameter name, so a trainer of any rank
        count can resume from it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))

    def _load_optimizer_state(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        if all(isinstance(key, int) for key in state["state"]):  # saved before names were kept
            self.optimizer.load_state_dict(state)
            return
        set_optimizer_state_dict(self.model, self.optimizer, state,
                                 options=StateDictOptions(full_state_dict=True))

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Take these weights (every trainable tensor, by name) as `version`."""
        named = dict(tensors)
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                if name not in named:
                    raise KeyError(f"weights of version {version} lack {name}")
                parameter.copy_(named[name])
        self.version = version


def read_groups(store: TrajectoryStore, samples: list[TrainSample]) -> list[list[Sequence]]:
    """The batch's trajectories from the store, laid out with their group advantages, by group
    in the order they first appear."""
    advantages = group_advantages(
        [Scored(s.trajectory_id, s.group_id, s.reward) for s in samples]
    )
    by_group: dict[str, list[Sequence]] = {}
    for sample in samples:
        records = store.read(sample.trajectory_id, sample.turns)
        if not records:
            raise ValueError(f"trajectory {sample.trajectory_id} has no stored turns")
        by_group.setdefault(sample.group_id, []).append(
            replace(layout(records, advantages[sample.trajectory_id]), domain=sample.domain)
        )
    return list(by_group.values())


KlSums = dict[str, tuple[float, float]]


def add_k3_sums(sums: KlSums, new: torch.Tensor, batch: _Batch) -> None:
    """Add the batch's k3 estimates of KL(pre-step || `new`), summed over each domain's sampled
    tokens, and the number of those tokens, to `sums`."""
    log_ratio = (new - batch.old).masked_fill(~batch.mask, 0.0)
    rows = ((log_ratio.exp() - 1 - log_ratio) * batch.mask).sum(-1).tolist()
    counts = batch.mask.sum(-1).tolist()
    domains = batch.domains or ("",) * len(rows)
    for domain, summed, count in zip(domains, rows, counts, strict=True):
        before = sums.get(domain, (0.0, 0.0))
        sums[domain] = (before[0] + summed, before[1] + count)


def step_kl(sums: KlSums, by_domain: bool) -> float:
    """The step's KL: over all sampled tokens, or the largest of the domains' own."""
    if by_domain and sums:
        return max(summed / max(count, 1.0) for summed, count in sums.values())
    total = sum(summed for summed, _ in sums.values())
    return total / max(sum(count for _, count in sums.values()), 1.0)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _pre_step_entropy(batches: list[_Batch]) -> float:
    """Mean entropy per sampled token under the pre-step policy."""
    entropies = torch.cat([b.old_entropy[b.mask] for b in batches])
    return float(entropies.mean()) if entropies.numel() else 0.0


def _mean_lag(versions_by_group: list[list[list[int]]], version: int) -> float:
    """How many versions behind `version` the policy that sampled a token was, on average."""
    lags = [version - v for group in versions_by_group for sequence in group for v in sequence]
    return sum(lags) / max(len(lags), 1)


def learning_stats(batches: list[_Batch], groups: list[list[Sequence]],
                   versions_by_group: list[list[list[int]]], version: int,
                   algorithm: AlgorithmConfig, step_kl: float, step_kept: float,
                   grad_norm: float, entropy_coef: float, mean_lag: float) -> LearningStats:
    """What a step saw and did, fresh groups (sampled by the pre-step version) apart from stale
    ones: the figures that tell a collapse from bad luck."""
    log_ratio = torch.cat([(b.old - b.behaviour)[b.mask] for b in batches])
    ratio = log_ratio.exp()
    quantiles = torch.tensor([0.05, 0.5, 0.95])
    ratio_q = torch.quantile(ratio, quantiles).tolist() if ratio.numel() else [0.0] * 3
    cap = algorithm.tis_cap
    fresh, stale = [], []
    for group, versions in zip(groups, versions_by_group, strict=True):
        oldest = min((v for sequence in versions for v in sequence), default=version)
        (stale if oldest < version else fresh).append(group)

    def signal(part: list[list[Sequence]]) -> int:
        return sum(any(s.advantage != 0 for s in g) for g in part)

    return LearningStats(
        mean_lag=mean_lag,
        step_kl=step_kl,
        step_kept=step_kept,
        grad_norm=grad_norm,
        entropy=_pre_step_entropy(batches),
        entropy_coef=entropy_coef,
        ratio_p05=ratio_q[0], ratio_p50=ratio_q[1], ratio_p95=ratio_q[2],
        truncated_share=float((ratio > cap).float().mean()) if cap and ratio.numel() else 0.0,
        low_weight_share=float((ratio < 0.5).float().mean()) if ratio.numel() else 0.0,
        fresh_groups=len(fresh), stale_groups=len(stale),
        fresh_groups_with_signal=signal(fresh), stale_groups_with_signal=signal(stale),
    )
