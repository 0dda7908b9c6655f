"""Lesson 05's memory model: `gradient` frees each tape entry as its sweep passes it, so recomputing the last
segment of a checkpointed network lowers neither the estimated nor the measured peak."""
import numpy as np
import fastad as fd
from fastad.backend import manual_seed, random_normal
from fastad.checkpointing import CheckpointPlan, CheckpointedSequence, LayerCost, estimate, even_segments, plan_for_budget
from fastad.memory import peak_bytes

def test_recomputing_the_last_segment_lowers_no_estimate():
    costs = [LayerCost(1000, 500)] * 8
    recomputed_last, stored_last = estimate(costs, even_segments(8, 2)), estimate(costs, [(0, 4, True), (4, 8, False)])
    assert stored_last[0] == recomputed_last[0]             # the same peak
    assert (stored_last[1], recomputed_last[1]) == (4, 8)    # half the recomputation

def test_the_estimate_is_the_checkpoints_before_the_last_segment_plus_that_segment():
    costs = [LayerCost(100, 0)] * 8
    assert [estimate(costs, even_segments(8, k), margin=0)[0] for k in (2, 3, 4)] == [500, 400, 500]

def test_a_plan_at_the_peak_of_even_segments_stores_the_last_one_and_recomputes_less():
    costs = [LayerCost(100, 0)] * 8
    budget = estimate(costs, even_segments(8, 3), margin=0)[0]
    plan = plan_for_budget(costs, budget, margin=0)
    assert not plan[-1][2]
    assert estimate(costs, plan, margin=0) == (400, 6)

def test_the_measured_peak_is_the_same_whether_the_last_segment_is_recomputed_or_stored():
    manual_seed(0)
    layers = [fd.Dense(128, 128, activation=np.tanh) for _ in range(8)]
    x = random_normal((512, 128))
    loss = lambda m: (m(x) ** 2).mean()
    def peak(segments):
        model = CheckpointedSequence(layers=layers, plan=CheckpointPlan(segments=segments))
        return peak_bytes(fd.gradient(loss), model)[1]
    activation = 512 * 128 * 4
    recomputed_last, stored_last = peak(even_segments(8, 2)), peak([(0, 4, True), (4, 8, False)])
    assert abs(recomputed_last - stored_last) < activation, (recomputed_last, stored_last)
