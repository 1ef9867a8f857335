"""Single-turn arithmetic with verifiable answers: the built-in decode-heavy reasoning domain.

The prompt is a sum of `terms` numbers of `digits` digits each, written digit by digit ("3 7 + 4
5 =") so a word-level tokenizer reads it; the answer is free text made of digits, scored 1 when
its digits spell the exact sum. `answer_alphabet` tells generation which tokens an answer may
use, so even an untrained policy produces parseable answers.
"""

from __future__ import annotations

import random
from typing import Any

from rollart.envs.base import StepResult, register_env

DIGITS = [str(d) for d in range(10)]
SYMBOLS = ["+", "="]


def spell(number: int) -> str:
    return " ".join(str(number))


def parse_answer(text: str) -> int | None:
    """The number the answer's digits spell, ignoring spaces; None if it has anything else."""
    compact = "".join(text.split())
    return int(compact) if compact.isdigit() else None


@register_env("arithmetic")
class ArithmeticEnv:
    action_vocabulary = None
    answer_alphabet = DIGITS

    def __init__(self, digits: int = 1, terms: int = 2) -> None:
        if digits < 1 or terms < 2:
            raise ValueError(f"arithmetic needs digits >= 1 and terms >= 2, got {digits}, {terms}")
        self.digits, self.terms = digits, terms
        self.numbers: list[int] = []

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)
        low = 0 if self.digits == 1 else 10 ** (self.digits - 1)
        self.numbers = [rng.randint(low, 10**self.digits - 1) for _ in range(self.terms)]
        prompt = " + ".join(spell(n) for n in self.numbers) + " ="
        return prompt, {"success": False}

    def step(self, action: str) -> StepResult:
        answer = parse_answer(action)
        correct = answer == sum(self.numbers)
        return StepResult("", 1.0 if correct else 0.0, True,
                          info={"success": correct, "invalid": answer is None})
