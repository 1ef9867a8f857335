"""GRPO's math, kept apart from models and I/O so tests can drive it directly."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Scored:
    trajectory_id: str
    group_id: str
    reward: float


def group_advantages(samples: Sequence[Scored], eps: float = 1e-6) -> dict[str, float]:
    """(reward - group mean) / group std for each trajectory. A group whose rewards are all equal
    carries no signal and gets zero advantage."""
    groups: dict[str, list[Scored]] = defaultdict(list)
    for sample in samples:
        groups[sample.group_id].append(sample)
    advantages = {}
    for members in groups.values():
        rewards = [m.reward for m in members]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for member in members:
            advantages[member.trajectory_id] = (member.reward - mean) / (std + eps) if std else 0.0
    return advantages


def sampling_log_distribution(
    logits: torch.Tensor,
    temperature: float,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probabilities of the distribution the engine samples from: temperature-scaled
    logits, restricted to `allowed` ([batch, vocab] bool) where decoding was constrained."""
    scaled = logits.float() / temperature
    if allowed is not None:
        scaled = scaled.masked_fill(~allowed[:, None, :], float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability of each target under the sampling distribution."""
    log_p = sampling_log_distribution(logits, temperature, allowed)
    return log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy(log_p: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's distribution (tokens outside a constrained mask hold -inf
    and contribute nothing)."""
    finite = torch.where(torch.isfinite(log_p), log_p, torch.zeros_like(log_p))
    return -(log_p.exp() * finite).sum(-1)


@dataclass
class LossStats:
    loss: torch.Tensor
    clip_fraction: float
    tokens: int


def loss_normalizer(loss_mask: torch.Tensor, advantages: torch.Tensor,
                    aggregation: str) -> float:
    """What `clipped_policy_loss` divides a batch's summed loss by: its sampled tokens
    (token_mean), its sequences that have any (sequence_mean), or its tokens of sequences with a
    nonzero advantage (signal_token_mean); at least 1."""
    if aggregation == "sequence_mean":
        count = (loss_mask.sum(-1) > 0).sum()
    elif aggregation == "token_mean":
        count = loss_mask.sum()
    elif aggregation == "signal_token_mean":
        count = (loss_mask & (advantages != 0).expand_as(loss_mask)).sum()
    else:
        raise ValueError(f"unknown loss aggregation {aggregation!r}")
    return float(max(int(count.item()), 1))


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float,
    weights: torch.Tensor | None = None,
    aggregation: str = "token_mean",
    clip_eps_high: float | None = None,
    normalizer: float | None = None,
) -> LossStats:
    """PPO's clipped surrogate against the old (pre-step) policy over sampled tokens only
    (`loss_mask` zeroes observation and padding tokens), each token scaled by its off-policy
    correction weight. `token_mean` averages over the batch's tokens, so a long episode weighs
    more than a short one; `sequence_mean` averages each sequence over its own tokens first, so
    every episode weighs the same. `clip_eps_high` (DAPO's clip-higher) lets a token with a
    positive advantage rise further than `clip_eps` before its gradient stops. Neither helped on
    FrozenLake (benchmarks/learning_lab.md); they are there for tasks where they do.
    `signal_token_mean` averages over the tokens of sequences with a nonzero advantage only: a
    group whose members all scored the same teaches nothing, and under token_mean its tokens
    still shrink every other sequence's step (in a multitask batch where one domain is solved,
    the other domain's steps shrank to its share of the batch's tokens). A data-parallel rank
    that holds some of a batch's rows passes the whole batch's `normalizer` (`loss_normalizer`),
    so the ranks' losses sum to the batch's."""
    # Unsampled positions may hold -inf (tokens outside a constrained mask): zero them out.
    logprobs = logprobs.masked_fill(~loss_mask, 0.0)
    old_logprobs = old_logprobs.masked_fill(~loss_mask, 0.0)
    mask = loss_mask.float() if weights is None else loss_mask.float() * weights
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    tokens = int(loss_mask.sum().item())
    denominator = max(tokens, 1)
    if normalizer is None:
        normalizer = loss_normalizer(loss_mask, advantages, aggregation)
    if aggregation == "sequence_mean":
        lengths = loss_mask.sum(-1)
        per_sequence = (per_token * mask).sum(-1) / lengths.clamp(min=1)
        loss = per_sequence[lengths > 0].sum() / normalizer
    else:
        loss = (per_token * mask).sum() / normalizer
    was_clipped = (((ratio < 1 - clip_eps) | (ratio > 1 + high)) & loss_mask).float()
    return LossStats(loss, float(was_clipped.sum().item() / denominator), tokens)


@dataclass
class Correction:
    """Truncated importance sampling from the behaviour policy (the engine that sampled) to the
    old policy (the trainer's weights before this step)."""

    weights: torch.Tensor
    sequence_mask: torch.Tensor
    ratio_mean: float
    ratio_max: float
    kl_estimate: float
    mismatch: float
    masked_sequences: int


def off_policy_correction(
    old_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    cap: float | None,
    sequence_threshold: float | None,
) -> Correction:
    """Per-token weights min(pi_old / pi_behaviour, cap); sequences whose mean |log ratio|
    exceeds `sequence_threshold` are masked whole. Also the train/inference mismatch figures:
    ratio mean and max, and the k3 estimate of KL(behaviour || old)."""
    log_ratio = (old_logprobs - behaviour_logprobs).masked_fill(~loss_mask, 0.0).detach()
    ratio = torch.exp(log_ratio)
    mask = loss_mask.float()
    tokens = max(mask.sum().item(), 1.0)
    per_sequence = (log_ratio.abs() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    keep = torch.ones_like(per_sequence, dtype=torch.bool)
    if sequence_threshold is not None:
        keep = per_sequence <= sequence_threshold
    weights = ratio.clamp(max=cap) if cap is not None else torch.ones_like(ratio)
    weights = weights * keep[:, None].float()
    sampled = ratio[loss_mask]
    return Correction(
        weights=weights,
        sequence_mask=keep,
        ratio_mean=float((ratio * mask).sum().item() / tokens),
        ratio_max=float(sampled.max().item()) if sampled.numel() else 0.0,
        kl_estimate=float(((ratio - 1 - log_ratio) * mask).sum().item() / tokens),
        mismatch=float((log_ratio.abs() * mask).sum().item() / tokens),
        masked_sequences=int((~keep).sum().item()),
    )
