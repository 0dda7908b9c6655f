"""Checkpointing either gives the plain code's value and gradient or says what to do: random generators left
alone by planning and replayed safely across threads, recomputation under the forward pass's derivative rules,
closures refused at the call, private generators replayed or caught, plans per input shape, and what a
checkpoint keeps alive measured against the plain code."""
import sys, threading, tracemalloc, warnings
import numpy as np
import pytest
import fastad as fd
from fastad import backend
from fastad.backend import random_normal, manual_seed, to_host
from fastad.checkpointing import BudgetWarning, estimate, even_segments, measure_layers
from fastad.errors import DifferentiationError
from fastad.memory import held_bytes, peak_bytes


class Seq(fd.Layer):
    layers: list
    def forward(self, x): return fd.sequenced(x, through=self.layers)


class Dropout(fd.Layer):
    "Drops half, from fastad's generator."
    def forward(self, x): return x * (random_normal(np.shape(x)) > 0).astype(x.dtype) * 2


RNG = np.random.default_rng(0)          # a generator of the user's own, that no replay knows unless told


class Noisy(fd.Layer):
    "Multiplies by noise from `RNG`."
    def forward(self, x): return x * RNG.standard_normal(np.shape(x))


def _dense(n, width=16, seed=0):
    manual_seed(seed)
    return [fd.Dense(width, width, activation=np.tanh) for _ in range(n)]


def _equal(a, b, exactly=True):
    check = np.testing.assert_array_equal if exactly else lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
    for u, v in zip(a.layers, b.layers):
        u, v = getattr(u, 'wrapped', u), getattr(v, 'wrapped', v)
        if hasattr(u, 'weight'): check(to_host(u.weight), to_host(v.weight))


# --- 17.7: planning leaves randomness alone ----------------------------------------------------------------
def test_planning_a_budget_leaves_the_generators_alone():
    layers = [l for d in _dense(4) for l in (d, Dropout())]
    x = random_normal((8, 16))
    loss = lambda m: (m(x) ** 2).sum()
    manual_seed(4); want = fd.gradient(loss, Seq(layers)); after_plain = to_host(random_normal(3))
    manual_seed(4); got = fd.gradient(loss, fd.checkpoint_sequential(layers, budget=10 ** 9))   # plans here
    after_planned = to_host(random_normal(3))
    _equal(got, want)
    np.testing.assert_array_equal(after_planned, after_plain)


# --- 17.9: closures in recomputed bodies -------------------------------------------------------------------
def test_a_body_closing_over_a_traced_value_is_refused_at_the_call():
    def f(x):
        y = np.sin(x)
        body = fd.make_recomputed_in_gradient(lambda z: z * y)      # y is traced: its derivative would be lost
        return body(x).sum()
    with pytest.raises(DifferentiationError, match='closure') as e:
        fd.value_with_pullback(f, np.ones(3))                       # at the call, not in the backward pass
    assert 'after its transform finished' not in str(e.value)
    # a body closing over a constant, or given y as an argument, is fine
    c = np.arange(3.0)
    got = fd.gradient(lambda x: fd.make_recomputed_in_gradient(lambda z, y: z * y * c)(x, np.sin(x)).sum(), np.ones(3))
    np.testing.assert_allclose(got, c * (np.sin(1.0) + np.cos(1.0)))


# --- 24.2: what a checkpoint keeps alive --------------------------------------------------------------------
def test_discarding_holds_less_than_half_of_the_plain_convolution():
    manual_seed(0)
    x = random_normal((8, 20, 20, 3))
    conv = fd.Conv2D(filter_shape=(5, 5, 3, 16), activation=np.tanh)
    plain = held_bytes(lambda c: c(x).sum(), conv)
    discarding = held_bytes(lambda c: c(x).sum(), conv.discarding_activations())
    assert plain >= 8 * 16 * 16 * 16 * 4                    # the plain layer keeps its tanh output
    assert discarding < 0.5 * plain, (discarding, plain)


def _loop(cell, steps=40):
    def f(h):
        for _ in range(steps): h = cell(h)
        return h.sum()
    return f


def test_a_checkpointed_cell_in_a_loop_holds_about_what_the_plain_one_holds():
    manual_seed(0)
    w, h = random_normal((64, 64)) / 8, random_normal((16, 64))
    cell = lambda h: np.tanh(h @ w)
    checkpointed_loop = _loop(fd.make_recomputed_in_gradient(cell))
    fd.gradient(checkpointed_loop, h)          # first calls make caches that live on (fastad's generator, say): not held
    plain = held_bytes(_loop(cell), h)
    checkpointed = held_bytes(checkpointed_loop, h)
    assert checkpointed <= 2 * plain, (checkpointed, plain)        # before: 6.8 times; now ~1.5 (small arrays: per-call bookkeeping shows)
    assert checkpointed - 40 * h.nbytes < 40 * 4096                 # beyond its input, < 4 KiB a call (was 31 KiB)


def test_a_checkpoint_that_draws_nothing_makes_no_generator(monkeypatch):
    f = fd.make_recomputed_in_gradient(np.tanh)
    fd.gradient(lambda x: f(x).sum(), np.ones(3))            # fastad's generator exists from here on
    made = []
    real = backend.default_rng
    monkeypatch.setattr(backend, 'default_rng', lambda *a: made.append(1) or real(*a))
    for _ in range(3): fd.gradient(lambda x: f(x).sum(), np.ones(3))
    assert made == []


def test_draws_are_still_replayed_after_calls_that_draw_nothing():
    quiet = fd.make_recomputed_in_gradient(np.tanh)
    noisy = fd.make_recomputed_in_gradient(lambda x: x * np.random.rand(*np.shape(x)))
    loss = lambda x: (quiet(x) * noisy(x) + noisy(quiet(x))).sum()
    plain = lambda x: (np.tanh(x) * (x * np.random.rand(3)) + np.tanh(x) * np.random.rand(3)).sum()
    np.random.seed(1); got = fd.gradient(loss, np.ones(3))
    np.random.seed(1); want = fd.gradient(plain, np.ones(3))
    np.testing.assert_array_equal(got, want)


# --- 24.3: the caller's tracemalloc, and threads ------------------------------------------------------------
def test_planning_keeps_the_callers_tracemalloc_peak():
    layers, x = _dense(4), random_normal((8, 16))
    started = not tracemalloc.is_tracing()
    if started: tracemalloc.start()
    try:
        big = np.ones(2 * 2 ** 20); del big                 # a 16 MiB peak
        peak_before = tracemalloc.get_traced_memory()[1]
        fd.gradient(lambda m: m(x).sum(), fd.checkpoint_sequential(layers, budget=10 ** 9))
        assert tracemalloc.get_traced_memory()[1] >= peak_before >= 16 * 2 ** 20
    finally:
        if started: tracemalloc.stop()


def test_two_threads_replaying_the_global_generator_both_get_the_right_gradient():
    def block(x):
        for _ in range(100): x = x * np.random.rand()        # many draws from NumPy's global generator
        return x
    np.random.seed(0)
    _, pb = fd.value_with_pullback(lambda x: fd.with_recomputation_in_pullbacks(x, block).sum(), np.ones(2))
    want = pb(1.0)
    results, start = [], threading.Barrier(4)
    def work():
        start.wait()
        for _ in range(20): results.append(pb(1.0))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                              # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
    finally: sys.setswitchinterval(interval)
    assert len(results) == 80
    for r in results: np.testing.assert_array_equal(r, want)


def test_a_thread_drawing_during_a_replay_gets_the_replayed_numbers_and_its_draw_is_undone():
    "What the docstring of make_recomputed_in_gradient says a replay does to another thread's global draws."
    replaying, drawn, runs, got = threading.Event(), threading.Event(), [], {}
    def block(x):
        runs.append(1)
        x = x * np.random.rand()
        if len(runs) == 2:                                   # the recomputation: the other thread draws now
            replaying.set(); assert drawn.wait(10)
        return x
    np.random.seed(0); stream = np.random.rand(2); np.random.seed(0)
    _, pb = fd.value_with_pullback(lambda x: fd.with_recomputation_in_pullbacks(x, block).sum(), np.ones(2))
    after_forward = np.random.get_state()
    def other():
        if replaying.wait(10): got['draw'] = np.random.rand()
        drawn.set()
    thread = threading.Thread(target=other); thread.start()
    try: np.testing.assert_array_equal(pb(1.0), [stream[0]] * 2)
    finally: drawn.set(); thread.join(10)
    assert len(runs) == 2 and got['draw'] == stream[1]      # the replayed stream's next number
    next_draw = np.random.rand()
    np.random.set_state(after_forward)
    assert next_draw == np.random.rand()                     # its draw was undone: the stream goes on from the forward's


# --- 24.6: the rules of the forward pass ----------------------------------------------------------------
def square(x): return x * x


def test_a_checkpoint_recomputes_under_the_rules_of_its_forward_pass():
    x = np.ones(2)
    body = fd.make_recomputed_in_gradient(lambda x: square(x))
    with fd.derivative(of=square, vjp=lambda x: (x * x, lambda g: g * 0.1)):
        _, pb_plain = fd.value_with_pullback(lambda x: square(x).sum(), x)
        _, pb_ckpt = fd.value_with_pullback(lambda x: body(x).sum(), x)
    np.testing.assert_allclose(pb_plain(1.0), [0.1, 0.1])
    np.testing.assert_allclose(pb_ckpt(1.0), [0.1, 0.1])      # not [2, 2], the rule in force now
    assert fd.registered_derivative(square) is None            # and the rule is gone again afterwards
    np.testing.assert_allclose(fd.gradient(lambda x: square(x).sum(), x), [2, 2])
    # the other way round: a rule registered after the forward pass does not apply to its recomputation
    _, pb_ckpt = fd.value_with_pullback(lambda x: body(x).sum(), x)
    with fd.derivative(of=square, vjp=lambda x: (x * x, lambda g: g * 0.1)) as rule:
        np.testing.assert_allclose(pb_ckpt(1.0), [2, 2])
        assert fd.registered_derivative(square) is rule        # and is in force again afterwards
        np.testing.assert_allclose(fd.gradient(lambda x: square(x).sum(), x), [0.1, 0.1])


def test_a_numpy_rule_of_the_forward_pass_is_used_by_its_recomputation():
    x = np.array([0.5, 1.0])
    body = fd.make_recomputed_in_gradient(np.sin)
    with fd.derivative(of=np.sin, vjp=lambda x: (np.sin(x), lambda g: g * 0 + 7.0)):
        _, pb = fd.value_with_pullback(lambda x: body(x).sum(), x)
    np.testing.assert_allclose(pb(1.0), [7.0, 7.0])
    np.testing.assert_allclose(fd.gradient(lambda x: np.sin(x).sum(), x), np.cos(x))


# --- 25.2: generators of your own in the layer forms -----------------------------------------------------
def _noisy_layers():
    return [l for d in _dense(4, seed=1) for l in (d, Noisy())]


def test_checkpoint_sequential_replays_the_generators_it_is_given():
    layers, x = _noisy_layers(), random_normal((8, 16))
    loss = lambda m: (m(x) ** 2).sum()
    RNG.bit_generator.state = np.random.default_rng(7).bit_generator.state
    want = fd.gradient(loss, Seq(layers))
    RNG.bit_generator.state = np.random.default_rng(7).bit_generator.state
    got = fd.gradient(loss, fd.checkpoint_sequential(layers, segments=4, generators=[RNG]))
    _equal(got, want)


def test_discarding_activations_replays_the_generators_it_is_given():
    dense, x = _dense(2, seed=2), random_normal((8, 16))
    loss = lambda m: (m(x) ** 2).sum()
    RNG.bit_generator.state = np.random.default_rng(7).bit_generator.state
    want = fd.gradient(loss, Seq([dense[0], Noisy(), dense[1]]))
    RNG.bit_generator.state = np.random.default_rng(7).bit_generator.state
    got = fd.gradient(loss, Seq([dense[0], Noisy().discarding_activations(generators=[RNG]), dense[1]]))
    _equal(got, want, exactly=False)          # float64 noise on float32 values: rounding in another order


def test_a_generator_not_replayed_is_caught_where_the_output_was_kept():
    layers, x = _noisy_layers(), random_normal((8, 16))
    loss = lambda m: (m(x) ** 2).sum()
    with pytest.raises(DifferentiationError, match='generators='):
        fd.gradient(loss, fd.checkpoint_sequential(layers, segments=4))
    dense = _dense(2, seed=2)
    with pytest.raises(DifferentiationError, match='generators='):
        fd.gradient(loss, Seq([dense[0], Noisy().discarding_activations(), dense[1]]))
    with pytest.raises(DifferentiationError, match='generators='):
        fd.gradient(lambda x: (fd.with_recomputation_in_pullbacks(x, Noisy()) ** 2).sum(), x)


# --- 25.3: a plan per input shape --------------------------------------------------------------------------
def test_a_budget_plan_is_made_again_for_a_new_input_shape():
    layers = _dense(16, width=64)
    loss = lambda x: lambda m: (m(x) ** 2).mean()
    small, big = random_normal((256, 64)), random_normal((1024, 64))
    grads = sum(l.weight.nbytes + l.bias.nbytes for l in layers)
    budget = int(estimate(measure_layers(layers, big), even_segments(16, 4))[0])
    model = fd.checkpoint_sequential(layers, budget=budget)
    fd.gradient(loss(small), model)
    assert model.plan.costs[0].output == small.nbytes
    _, peak = peak_bytes(fd.gradient(loss(big)), model)
    assert model.plan.costs[0].output == big.nbytes          # measured again for the bigger batch
    assert peak - grads <= budget, (peak - grads, budget)
    # and a batch no plan fits gets a warning with the smallest peak possible, and runs with that plan
    huge = random_normal((4096, 64))
    with pytest.warns(BudgetWarning, match=r'no plan .* fits in .* bytes .*; the smallest peak possible is about'):
        g = fd.gradient(loss(huge), model)
    want = fd.gradient(loss(huge), Seq(layers))
    for a, b in zip(g.layers, want.layers): np.testing.assert_allclose(a.weight, b.weight, rtol=1e-4, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        fd.gradient(loss(small), model)                      # the first plan again, no warning
    assert model.plan.costs[0].output == small.nbytes


def test_a_cached_gaussian_of_numpys_global_generator_counts_as_a_draw():
    "NumPy's legacy normal draws come in pairs: the second is cached, and drawing it moves no MT19937 word."
    body = fd.make_recomputed_in_gradient(lambda x: x * np.random.randn())
    np.random.seed(0); np.random.randn()                    # a Gaussian is cached now
    got = fd.gradient(lambda x: (body(x) ** 2).sum(), np.ones(3))
    np.random.seed(0); np.random.randn()
    want = fd.gradient(lambda x: ((x * np.random.randn()) ** 2).sum(), np.ones(3))
    np.testing.assert_array_equal(got, want)


class DeviceStates(np.ndarray):
    """Stands in for CuPy's array of cuRAND states: `get()` reads it back to the host, `set(h)` writes it in place.
    A copy on the device is refused: a snapshot per checkpointed call there would add up in the GPU's memory."""
    def get(self): return np.array(self)
    def set(self, h): self[...] = h
    def copy(self, *a, **k): raise AssertionError("the generator's state was copied on the device")
    def __eq__(self, other): raise AssertionError("the generator's state was compared on the device")


class DeviceGenerator:
    "Shaped like CuPy's generator: its state a device array (`bit_generator._state`) that each draw changes in place."
    def __init__(self, seed):
        self.bit_generator = type('Bits', (), {})()
        self.bit_generator._state = np.array([seed, 0], np.uint64).view(DeviceStates)
    def standard_normal(self, shape):
        s = self.bit_generator._state
        values = np.random.default_rng([int(s[0]), int(s[1])]).standard_normal(shape)
        s[1] += 1
        return values


def test_a_generator_with_its_state_on_the_device_is_replayed():
    "CuPy's generator state is saved and compared on the host; the recomputation draws the forward pass's noise again."
    rng, x = DeviceGenerator(3), np.linspace(-1, 1, 5)
    noisy = fd.make_recomputed_in_gradient(lambda x: np.tanh(x) * rng.standard_normal(np.shape(x)), generators=[rng])
    g = fd.gradient(lambda x: noisy(x).sum(), x)
    noise = DeviceGenerator(3).standard_normal(5)                       # the one draw of the forward pass
    np.testing.assert_allclose(g, (1 - np.tanh(x) ** 2) * noise, rtol=1e-12)
    assert type(rng.bit_generator._state) is DeviceStates and list(rng.bit_generator._state) == [3, 1]   # one draw, then put back
    quiet = fd.make_recomputed_in_gradient(lambda x: np.tanh(x), generators=[rng])
    fd.gradient(lambda x: quiet(x).sum(), x)
    assert list(rng.bit_generator._state) == [3, 1]                      # no draw: nothing replayed, nothing moved
