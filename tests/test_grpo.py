import math

import pytest
import torch

from rollart.policy.grpo import (
    Scored,
    clipped_policy_loss,
    entropy,
    group_advantages,
    off_policy_correction,
    sampling_log_distribution,
    token_logprobs,
)


def test_advantages_are_normalized_within_each_group():
    samples = [Scored("a", "g1", 1.0), Scored("b", "g1", 0.0), Scored("c", "g1", 0.0),
               Scored("d", "g2", 5.0), Scored("e", "g2", 3.0)]
    adv = group_advantages(samples)
    assert sum(adv[t] for t in "abc") == pytest.approx(0.0, abs=1e-6)
    assert sum(adv[t] for t in "de") == pytest.approx(0.0, abs=1e-6)
    assert adv["a"] == pytest.approx(math.sqrt(2), rel=1e-4)
    # group 2 has the same spread in reward units as a 1/-1 group: scale does not leak across
    assert adv["d"] == pytest.approx(1.0, rel=1e-4) and adv["e"] == pytest.approx(-1.0, rel=1e-4)


def test_equal_rewards_carry_no_signal():
    adv = group_advantages([Scored("a", "g", 1.0), Scored("b", "g", 1.0)])
    assert adv == {"a": 0.0, "b": 0.0}


def test_constrained_logprobs_are_a_distribution_over_allowed_tokens():
    logits = torch.randn(1, 3, 10)
    allowed = torch.zeros(1, 10, dtype=torch.bool)
    allowed[0, [2, 5, 7]] = True
    total = sum(token_logprobs(logits, torch.full((1, 3), t), 0.7, allowed).exp()
                for t in (2, 5, 7))
    assert torch.allclose(total, torch.ones(1, 3), atol=1e-5)


def test_loss_ignores_observation_tokens():
    logprobs = torch.zeros(1, 4, requires_grad=True)
    behaviour = torch.zeros(1, 4)
    mask = torch.tensor([[False, True, False, True]])
    stats = clipped_policy_loss(logprobs, behaviour, torch.tensor([[1.0]]), mask, 0.2)
    stats.loss.backward()
    assert stats.tokens == 2
    assert logprobs.grad[0, 0] == 0 and logprobs.grad[0, 2] == 0
    assert logprobs.grad[0, 1] < 0 and logprobs.grad[0, 3] < 0


def test_sequence_mean_weighs_every_sequence_the_same_whatever_its_length():
    mask = torch.tensor([[True, True, True, True], [True, False, False, False]])
    advantages = torch.tensor([[1.0], [1.0]])
    grads = {}
    for aggregation in ("token_mean", "sequence_mean"):
        logprobs = torch.zeros(2, 4, requires_grad=True)
        clipped_policy_loss(logprobs, torch.zeros(2, 4), advantages, mask, 0.2,
                            aggregation=aggregation).loss.backward()
        grads[aggregation] = logprobs.grad
    # token_mean: every token -1/5, so the 4-token sequence gets 4x the push of the short one
    assert grads["token_mean"][0].sum() == pytest.approx(4 * grads["token_mean"][1].sum())
    # sequence_mean: each sequence's tokens share -1/2
    assert grads["sequence_mean"][0].sum() == pytest.approx(grads["sequence_mean"][1].sum())
    assert grads["sequence_mean"][1, 0] == pytest.approx(-0.5)
    # signal_token_mean: as token_mean when every sequence carries an advantage
    logprobs = torch.zeros(2, 4, requires_grad=True)
    clipped_policy_loss(logprobs, torch.zeros(2, 4), advantages, mask, 0.2,
                        aggregation="signal_token_mean").loss.backward()
    assert torch.allclose(logprobs.grad, grads["token_mean"])
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        clipped_policy_loss(torch.zeros(2, 4), torch.zeros(2, 4), advantages, mask, 0.2,
                            aggregation="sum")


def test_ratio_beyond_clip_stops_the_gradient():
    behaviour = torch.zeros(1, 2)
    logprobs = torch.tensor([[0.5, 0.0]], requires_grad=True)  # ratio e^0.5 > 1.2
    mask = torch.tensor([[True, True]])
    stats = clipped_policy_loss(logprobs, behaviour, torch.tensor([[1.0]]), mask, 0.2)
    stats.loss.backward()
    assert logprobs.grad[0, 0] == 0 and logprobs.grad[0, 1] != 0
    assert stats.clip_fraction == pytest.approx(0.5)


def test_clip_higher_lets_a_rewarded_token_rise_further_but_not_fall_further():
    mask = torch.tensor([[True, True]])
    grads = {}
    for high in (None, 0.5):
        logprobs = torch.tensor([[0.3, -0.3]], requires_grad=True)  # ratios 1.35 and 0.74
        stats = clipped_policy_loss(logprobs, torch.zeros(1, 2), torch.tensor([[1.0]]), mask,
                                    0.2, clip_eps_high=high)
        stats.loss.backward()
        grads[high] = (logprobs.grad[0].tolist(), stats.clip_fraction)
    # clip_fraction counts ratios outside the band: both, then only 0.74 (1.35 is in [0.8, 1.5])
    assert grads[None][0][0] == 0 and grads[None][1] == pytest.approx(1.0)
    assert grads[0.5][0][0] < 0 and grads[0.5][1] == pytest.approx(0.5)
    # a positive advantage on a ratio below 1 - eps is never clipped by PPO's min
    assert grads[None][0][1] == grads[0.5][0][1] != 0


def test_minus_infinity_outside_the_mask_stays_finite():
    logprobs = torch.tensor([[float("-inf"), -0.1]], requires_grad=True)
    behaviour = torch.tensor([[0.0, -0.1]])
    mask = torch.tensor([[False, True]])
    stats = clipped_policy_loss(logprobs, behaviour, torch.tensor([[1.0]]), mask, 0.2)
    stats.loss.backward()
    assert torch.isfinite(stats.loss) and torch.isfinite(logprobs.grad).all()
    correction = off_policy_correction(logprobs.detach(), behaviour, mask, 2.0, None)
    assert correction.mismatch == pytest.approx(0.0) and correction.ratio_max == 1.0


def test_truncated_importance_weights_and_sequence_mask():
    old = torch.tensor([[0.0, -1.0], [-0.1, -0.1]])
    behaviour = torch.tensor([[-2.0, -1.0], [-0.1, -0.1]])  # token 0 ratio e^2 = 7.39
    mask = torch.ones(2, 2, dtype=torch.bool)
    correction = off_policy_correction(old, behaviour, mask, cap=2.0, sequence_threshold=None)
    assert correction.weights[0, 0] == 2.0 and correction.weights[0, 1] == 1.0
    assert correction.ratio_max == pytest.approx(math.exp(2), rel=1e-5)
    assert correction.ratio_mean == pytest.approx((math.exp(2) + 3) / 4, rel=1e-5)
    assert correction.kl_estimate == pytest.approx((math.exp(2) - 1 - 2) / 4, rel=1e-5)
    masked = off_policy_correction(old, behaviour, mask, cap=2.0, sequence_threshold=0.5)
    assert masked.masked_sequences == 1
    assert masked.weights[0].sum() == 0 and masked.weights[1].sum() == 2.0


def test_correction_weights_scale_the_gradient():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights = torch.tensor([[2.0, 0.0]])
    clipped_policy_loss(logprobs, torch.zeros(1, 2), torch.tensor([[1.0]]), mask, 0.2,
                        weights=weights).loss.backward()
    assert logprobs.grad[0, 0] == pytest.approx(-1.0) and logprobs.grad[0, 1] == 0


def test_entropy_is_over_the_allowed_tokens_and_differentiable():
    logits = torch.zeros(1, 2, 10, requires_grad=True)
    allowed = torch.zeros(1, 10, dtype=torch.bool)
    allowed[0, [2, 5, 7]] = True
    values = entropy(sampling_log_distribution(logits, 1.0, allowed))
    assert torch.allclose(values, torch.full((1, 2), math.log(3)))
    values.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_signal_token_mean_ignores_sequences_that_teach_nothing():
    """A solved group (zero advantage) next to one with signal: under token_mean its tokens
    halve the other's step; under signal_token_mean the step is what it is alone."""
    mask = torch.ones(2, 3, dtype=torch.bool)
    grads = {}
    for aggregation in ("token_mean", "signal_token_mean"):
        logprobs = torch.zeros(2, 3, requires_grad=True)
        clipped_policy_loss(logprobs, torch.zeros(2, 3), torch.tensor([[1.0], [0.0]]), mask,
                            0.2, aggregation=aggregation).loss.backward()
        grads[aggregation] = logprobs.grad
    alone = torch.zeros(1, 3, requires_grad=True)
    clipped_policy_loss(alone, torch.zeros(1, 3), torch.tensor([[1.0]]), mask[:1], 0.2
                        ).loss.backward()
    assert torch.allclose(grads["signal_token_mean"][0], alone.grad[0])
    assert torch.allclose(grads["token_mean"][0], alone.grad[0] / 2)
    assert not grads["signal_token_mean"][1].any()
    nothing = clipped_policy_loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([[0.0]]),
                                  mask[:1], 0.2, aggregation="signal_token_mean")
    assert nothing.loss.item() == 0.0
