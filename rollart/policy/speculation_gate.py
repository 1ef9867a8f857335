"""When a replica speculates: below a fixed load threshold, or at each load on whichever side
measured more tokens per second.

Whether speculation pays at a given load depends on the hardware and on how well the drafts
match the policy, and both drift: a verify step costs compute a busy GPU cannot spare, while a
CPU replica of a tiny model is bound by per-step overhead and gains at any load
(`benchmarks/suffix_decoding.md`). So the learned gate measures instead of assuming. Loads are
bucketed by powers of two of the requests running; a window is `window_s` of generation during
which neither the bucket nor the side changed. Each side is tried for `windows_to_decide`
windows in a bucket, then the faster side holds, and the slower one is measured again for one
window after every `reprobe_every` windows of the faster one, so a change shows up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LEARNED = "learned"


@dataclass
class _Rate:
    windows: int = 0
    tokens_per_s: float = 0.0
    since_measured: int = 0  # windows of the other side since this one was measured

    def add(self, tokens_per_s: float, smoothing: float) -> None:
        self.tokens_per_s = (tokens_per_s if self.windows == 0
                             else smoothing * tokens_per_s + (1 - smoothing) * self.tokens_per_s)
        self.windows += 1
        self.since_measured = 0


class SpeculationGate:
    def __init__(self, limit: int | Literal["learned"] | None, window_s: float = 0.1,
                 windows_to_decide: int = 3, reprobe_every: int = 30,
                 smoothing: float = 0.3) -> None:
        self.limit = limit
        self.window_s = window_s
        self.windows_to_decide = windows_to_decide
        self.reprobe_every = reprobe_every
        self.smoothing = smoothing
        self._rates: dict[tuple[int, bool], _Rate] = {}
        self._window: tuple[int, bool] | None = None
        self._window_start = 0.0
        self._window_tokens = 0

    @staticmethod
    def bucket(running: int) -> int:
        """1, 2, 3-4, 5-8, ... requests: 0, 1, 2, 3, ..."""
        return max(running - 1, 0).bit_length()

    def wanted(self, running: int) -> bool:
        if self.limit is None:
            return True
        if self.limit != LEARNED:
            return running <= self.limit
        bucket = self.bucket(running)
        on, off = self._rate(bucket, True), self._rate(bucket, False)
        if on.windows < self.windows_to_decide:
            return True
        if off.windows < self.windows_to_decide:
            return False
        faster, slower = (on, off) if on.tokens_per_s >= off.tokens_per_s else (off, on)
        return (faster is on) != (slower.since_measured >= self.reprobe_every)

    def emitted(self, tokens: int, running: int, speculating: bool, now: float) -> None:
        """`tokens` came out of the engine at `now`, `running` requests in it."""
        if self.limit != LEARNED:
            return
        key = (self.bucket(running), speculating)
        if key != self._window:
            self._window, self._window_start, self._window_tokens = key, now, 0
            return
        self._window_tokens += tokens
        elapsed = now - self._window_start
        if elapsed >= self.window_s:
            self._rate(*key).add(self._window_tokens / elapsed, self.smoothing)
            self._rate(key[0], not speculating).since_measured += 1
            self._window_start, self._window_tokens = now, 0

    def rates(self) -> dict[str, float]:
        """Measured tokens per second, as '<bucket>:<on|off>'."""
        return {f"{bucket}:{'on' if on else 'off'}": rate.tokens_per_s
                for (bucket, on), rate in sorted(self._rates.items()) if rate.windows}

    def _rate(self, bucket: int, on: bool) -> _Rate:
        return self._rates.setdefault((bucket, on), _Rate())
