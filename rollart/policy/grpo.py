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


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability of each target under the sampling distribution: temperature-scaled logits,
    restricted to `allowed` ([batch, vocab] bool) where decoding was constrained."""
    scaled = logits.float() / temperature
    if allowed is not None:
        scaled = scaled.masked_fill(~allowed[:, None, :], float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@dataclass
class LossStats:
    loss: torch.Tensor
    clip_fraction: float
    tokens: int
    mismatch: float
    """Mean |trainer logprob - behaviour logprob| over sampled tokens."""


def clipped_policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float,
) -> LossStats:
    """PPO's clipped surrogate over sampled tokens only (`loss_mask` zeroes observation and
    padding tokens), averaged over the tokens of the batch."""
    # Unsampled positions may hold -inf (tokens outside a constrained mask): zero them out.
    logprobs = logprobs.masked_fill(~loss_mask, 0.0)
    behaviour_logprobs = behaviour_logprobs.masked_fill(~loss_mask, 0.0)
    mask = loss_mask.float()
    ratio = torch.exp(logprobs - behaviour_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    tokens = int(mask.sum().item())
    denominator = max(tokens, 1)
    loss = (per_token * mask).sum() / denominator
    was_clipped = ((ratio - 1).abs() > clip_eps).float()
    gap = ((logprobs - behaviour_logprobs).abs().detach() * mask).sum().item() / denominator
    return LossStats(loss, float((was_clipped * mask).sum().item() / denominator), tokens, gap)
