"""The speculation gate's decisions, from token counts fed by hand (no engine)."""

from __future__ import annotations

from rollart.policy.speculation_gate import LEARNED, SpeculationGate


def feed(gate: SpeculationGate, running: int, tokens_per_s: float, seconds: float,
         clock: list[float], step_s: float = 0.01) -> None:
    """Emit at `tokens_per_s` on whichever side the gate wants, for `seconds`."""
    for _ in range(round(seconds / step_s)):
        clock[0] += step_s
        gate.emitted(round(tokens_per_s * step_s), running, gate.wanted(running), clock[0])


def test_a_fixed_threshold_and_always():
    assert SpeculationGate(4).wanted(4) and not SpeculationGate(4).wanted(5)
    assert SpeculationGate(None).wanted(1000)


def test_loads_share_a_bucket_by_powers_of_two():
    assert [SpeculationGate.bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 64, 65)] == [
        0, 0, 1, 2, 2, 3, 3, 4, 6, 7]


def test_the_learned_gate_keeps_the_faster_side_at_each_load():
    gate, clock = SpeculationGate(LEARNED), [0.0]
    assert gate.wanted(64)  # tries speculation first
    # At 64 requests plain decoding is faster; at 2, speculation is.
    for _ in range(20):
        on = gate.wanted(64)
        feed(gate, 64, 800.0 if on else 1000.0, 0.11, clock)
        on = gate.wanted(2)
        feed(gate, 2, 300.0 if on else 100.0, 0.11, clock)
    assert not gate.wanted(64) and gate.wanted(2)
    rates = gate.rates()
    assert rates["6:off"] > rates["6:on"] and rates["1:on"] > rates["1:off"]


def test_the_slower_side_is_measured_again_so_a_change_shows_up():
    gate, clock = SpeculationGate(LEARNED, reprobe_every=5), [0.0]
    sides = []
    for round_ in range(60):
        on = gate.wanted(8)
        sides.append(on)
        faster_on = round_ >= 30  # drafts got better half way through
        feed(gate, 8, (1000.0 if on else 800.0) if faster_on else (700.0 if on else 900.0),
             0.11, clock)
    assert sides[25:30].count(False) >= 4 and sides[-5:].count(True) >= 4


def test_a_window_with_a_change_of_load_or_side_measures_nothing():
    gate, clock = SpeculationGate(LEARNED), [0.0]
    for running in (1, 2, 3, 5, 9) * 20:  # the load changes every step
        clock[0] += 0.01
        gate.emitted(10, running, True, clock[0])
    assert gate.rates() == {}
