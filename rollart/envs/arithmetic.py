"""Single-turn arithmetic with verifiable answers: the built-in decode-heavy reasoning domain.

The prompt is a sum of `terms` numbers of `digits` digits each (at most `max_operand`), written
digit by digit ("3 7 + 4 5 =") so a word-level tokenizer reads it; the answer is scored 1 when its
digits spell the exact sum. Answers have a fixed width, the digits of the largest possible sum,
zero-padded ("0 7"): `answer_alphabet` and `answer_length` tell generation to sample exactly that
many digit tokens, so even an untrained policy gives well-formed answers (and a random one is
right with probability 10^-width).
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
    vocabulary = DIGITS + SYMBOLS
    deterministic = True  # seed and actions determine it: rebuilt if its worker dies
    answer_alphabet = DIGITS

    def __init__(self, digits: int = 1, terms: int = 2, max_operand: int | None = None) -> None:
        if digits < 1 or terms < 2:
            raise ValueError(f"arithmetic needs digits >= 1 and terms >= 2, got {digits}, {terms}")
        self.low = 0 if digits == 1 else 10 ** (digits - 1)
        self.high = 10**digits - 1 if max_operand is None else max_operand
        if not self.low <= self.high < 10**digits:
            raise ValueError(f"arithmetic: max_operand {max_operand} does not fit {digits} digits")
        self.terms = terms
        self.answer_length = len(str(self.high * terms))
        self.numbers: list[int] = []

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)
        self.numbers = [rng.randint(self.low, self.high) for _ in range(self.terms)]
        prompt = " + ".join(spell(n) for n in self.numbers) + " ="
        return prompt, {"success": False}

    def step(self, action: str) -> StepResult:
        answer = parse_answer(action)
        correct = answer == sum(self.numbers)
        return StepResult("", 1.0 if correct else 0.0, True,
                          info={"success": correct, "invalid": answer is None})
