"""The online profiler's estimates and its remapping rule, driven without a server."""

from __future__ import annotations

import pytest

from rollart.contracts import PoolUsage, TrajectoryResult
from rollart.workflows.profiler import Accelerator, Profiler

POOLS = {"h800": Accelerator(replicas=1, dense_tflops=989, memory_tb_s=3.35),
         "h20": Accelerator(replicas=1, dense_tflops=148, memory_tb_s=4.0)}
CHOICES = {"grid": ["h800", "h20"], "answers": ["h800", "h20"]}


def served(domain: str, pool: str, prefill: int, decode: int, prefill_s: float,
           decode_s: float, turns: int = 1) -> TrajectoryResult:
    usage = PoolUsage(turns=turns, prefill_tokens=prefill, decode_tokens=decode,
                      prefill_s=prefill_s, decode_s=decode_s)
    return TrajectoryResult(trajectory_id=f"{domain}.{pool}", group_id="g", domain=domain,
                            status="completed", gen_usage={pool: usage})


def test_rates_are_measured_per_pool_and_loads_per_domain():
    profiler = Profiler(smoothing=1.0)
    profiler.observe([served("grid", "h800", 1000, 10, 1.0, 0.5, turns=10),
                      served("answers", "h800", 100, 90, 0.1, 4.5, turns=1)])
    rates = profiler.pools["h800"]
    assert rates.prefill_s_per_token == pytest.approx(1.1 / 1100)
    assert rates.decode_s_per_token == pytest.approx(5.0 / 100)
    assert profiler.domains["grid"].turns == 10
    assert profiler.domains["grid"].prefill_tokens == pytest.approx(100)
    assert profiler.domains["answers"].decode_tokens == pytest.approx(90)


def test_an_unmeasured_pool_borrows_rates_by_the_data_sheets():
    profiler = Profiler(smoothing=1.0)
    profiler.observe([served("grid", "h800", 1000, 100, 1.0, 1.0)])
    borrowed = profiler.rates("h20", POOLS)
    assert borrowed.prefill_s_per_token == pytest.approx(1e-3 * 989 / 148)
    assert borrowed.decode_s_per_token == pytest.approx(1e-2 * 3.35 / 4.0)
    assert profiler.rates("cpu", {"cpu": Accelerator(replicas=1)}) is None


def test_decode_heavy_work_is_moved_off_the_pool_prefill_needs():
    """Both domains on the compute pool: answers that grew long keep it busy decoding, so the
    profiler recommends moving them to the bandwidth pool, and keeps grid where it is."""
    profiler = Profiler(smoothing=1.0)
    profiler.observe([served("grid", "h800", 4000, 40, 4.0, 0.4, turns=40),
                      served("answers", "h800", 200, 4000, 0.2, 40.0, turns=8)])
    current = {"grid": "h800", "answers": "h800"}
    mapping, seconds = profiler.recommend(CHOICES, POOLS)
    assert mapping == {"grid": "h800", "answers": "h20"}
    assert seconds < profiler.predict(current, POOLS)


def test_remap_waits_for_patience_and_a_margin_and_does_not_flap():
    profiler = Profiler(smoothing=1.0)
    long_answers = [served("grid", "h800", 4000, 40, 4.0, 0.4, turns=40),
                    served("answers", "h800", 200, 4000, 0.2, 40.0, turns=8)]
    current = {"grid": "h800", "answers": "h800"}
    decisions = []
    for _ in range(3):
        profiler.observe(long_answers)
        decisions.append(profiler.decide(current, CHOICES, POOLS, remap=True, margin=0.15,
                                         patience=3))
    assert [d.remapped for d in decisions] == [False, False, True]
    assert decisions[-1].recommended == {"grid": "h800", "answers": "h20"}
    # after the move, a prediction within the margin changes nothing
    moved = {"grid": "h800", "answers": "h20"}
    choices = {"grid": ["h800", "h20"], "answers": ["h20", "h800"]}
    for _ in range(5):
        profiler.observe([served("grid", "h800", 4000, 40, 4.0, 0.4, turns=40),
                          served("answers", "h20", 200, 4000, 1.4, 34.0, turns=8)])
        decision = profiler.decide(moved, choices, POOLS, remap=True, margin=0.15, patience=3)
        assert not decision.remapped


def test_without_remap_it_only_recommends():
    profiler = Profiler(smoothing=1.0)
    current = {"grid": "h800", "answers": "h800"}
    for _ in range(5):
        profiler.observe([served("grid", "h800", 4000, 40, 4.0, 0.4, turns=40),
                          served("answers", "h800", 200, 4000, 0.2, 40.0, turns=8)])
        decision = profiler.decide(current, CHOICES, POOLS, remap=False, margin=0.15,
                                   patience=1)
        assert not decision.remapped and decision.recommended["answers"] == "h20"
