"""Memory: long training keeps memory flat, a dropped pullback frees its tape, a finished gradient keeps nothing, and
memory meters nest.

Weak references prove what is freed: NumPy arrays and Python functions accept them (the traced value and the
trace use __slots__ without a weakref slot, so we watch what they hold instead). Where a test says "without
gc.collect()", the collector is switched off around it, so reference counting alone must free the memory: that
holds wherever the engine builds no reference cycles (the plain primitives, the pullback, the tape).
"""
import gc, tracemalloc, weakref
import numpy as np, pytest
import fastad as fd
from fastad import engine, backend

from engine_helpers import active_log, live_traces, engine_state, collector_off, saved_by_the_tape

# --- 10,000 training steps: memory stays flat -------------------------------------------------------------------
@pytest.mark.slow   # 10,000 steps; test_a_finished_gradient_keeps_nothing checks one
def test_ten_thousand_training_steps_keep_memory_flat():
    """A 2-layer MLP on a batch of 4, SGD by hand, 10,000 steps: the memory still allocated after step 10,000
    but not after step 1,000 (tracemalloc, started at step 1,000) stays under 64 KiB: one leaked object per step
    (a tape, a log entry, a memo) would already be 9,000 objects."""
    r = np.random.default_rng(0)
    x, y = r.standard_normal((4, 3)), r.standard_normal((4, 1))
    params = (r.standard_normal((3, 5)) * 0.5, r.standard_normal((5, 1)) * 0.5)
    def loss(w1, w2): return ((np.tanh(x @ w1) @ w2 - y) ** 2).mean()
    def step(params):
        value, grads = fd.value_with_gradient(loss, *params)
        return value, tuple(p - 0.05 * g for p, g in zip(params, grads))
    first = loss(*params)
    for _ in range(1_000): value, params = step(params)
    gc.collect()
    tracemalloc.start()
    try:
        at_1000 = tracemalloc.get_traced_memory()[0]
        for _ in range(9_000): value, params = step(params)
        gc.collect()
        at_10000 = tracemalloc.get_traced_memory()[0]
    finally: tracemalloc.stop()
    assert value < first                                           # it trained
    assert at_10000 - at_1000 < 64 * 1024, (at_1000, at_10000)

# --- a dropped pullback frees its tape -----------------------------------------------------------------------------

def mlp_loss(kept):
    def f(x): return (saved_by_the_tape(kept, np.tanh(x) @ np.ones((10, 10))) * x).sum()
    return f

def drop_a_pullback(collect):
    kept = []
    value, pb = fd.value_with_pullback(mlp_loss(kept), np.ones((4, 10)))
    pb(1.0); pb(1.0)
    assert kept[0]() is not None                                   # alive while the pullback is
    pullback = weakref.ref(pb)
    del pb
    if collect: gc.collect()
    assert pullback() is None and kept[0]() is None

def finish_a_gradient(collect):
    kept = []
    fd.gradient(mlp_loss(kept), np.ones((4, 10)))
    if collect: gc.collect()
    assert kept[0]() is None

def test_dropping_the_pullback_frees_the_tape():
    drop_a_pullback(collect=True)

def test_a_finished_gradient_keeps_nothing():
    finish_a_gradient(collect=True)

def test_dropping_the_pullback_frees_the_tape_without_the_collector():
    with collector_off(): drop_a_pullback(collect=False)

def test_a_finished_gradient_keeps_nothing_without_the_collector():
    with collector_off(): finish_a_gradient(collect=False)

def test_nested_transforms_free_their_tapes():
    kept = []
    value, pb = fd.value_with_pullback(lambda x: fd.gradient(lambda y: saved_by_the_tape(kept, y * x).sum(), x) * 2.0, np.ones(50))
    pb(np.ones(50))
    del pb
    gc.collect()
    assert kept[0]() is None

def test_custom_derivatives_and_hooks_free_their_tapes():
    "A custom VJP's pullback, and a hook, are the user's closures: whatever they hold goes with the pullback."
    kept = []
    @fd.differentiable_function
    def cube(x):
        ans = x ** 3
        kept.append(weakref.ref(ans))
        return ans, lambda g: g * 3 * x ** 2
    def f(x): return fd.with_derivative(cube(x), lambda g: g * 2.0).sum()
    value, pb = fd.value_with_pullback(f, np.ones(100))
    assert np.allclose(pb(1.0), 6.0)
    pullback = weakref.ref(pb)
    del pb
    gc.collect()
    assert pullback() is None and kept[0]() is None

def test_memory_meters_nest(any_backend):
    "An inner meter (a planner measuring layers, inside a step that is measured) leaves the outer one's peak whole."
    from fastad import backend
    from fastad.memory import MemoryMeter
    with MemoryMeter() as outer:
        before = outer.used()
        big = backend.zeros((1_000_000,), dtype=np.float64); del big          # 8 MB, come and gone
        with MemoryMeter() as inner:
            small = backend.zeros((1000,), dtype=np.float64)
            assert inner.peak() - inner.used() < 1_000_000                     # the inner one starts afresh
            del small
        assert outer.peak() - before >= 8_000_000
