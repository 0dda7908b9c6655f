"""Recomputation in pullbacks: what runs (counted), the gradients (equal to the plain ones, exactly, even with
random draws inside the recomputed region), structured arguments and results, and bad input; randomness left alone by planning, closures refused, the forward
pass's rules in the recomputation, private generators, a plan per input shape, what a checkpoint keeps alive, and the
memory model (recomputing the last segment lowers no peak)."""
import random
import numpy as np
import pytest
import fastad as fd
from fastad.backend import random_normal, manual_seed, to_host, use_backend
from fastad.errors import ArgumentError, DifferentiationError


class Affine(fd.Differentiable):
    w: object
    b: object
    scale: int = fd.nondifferentiable(default=2)


def affine(model, x): return np.tanh(x @ model.w + model.b) * model.scale


def test_recomputed_function_runs_once_forward_and_once_more_backward():
    runs = []
    @fd.make_recomputed_in_gradient
    def square(x):
        runs.append(1)
        return x * x
    with fd.trace_primitives() as log: g = fd.gradient(lambda x: square(np.cos(x)), 10.0)
    assert g == pytest.approx(-np.sin(20.0))
    assert len(runs) == 2
    assert log.count('forward', 'square') == 2            # counted by name: forward run + recomputation
    assert log.count('forward', 'multiply') == 1          # only the recomputation records the product


def test_without_a_transform_it_is_the_plain_function():
    runs = []
    def f(x):
        runs.append(1)
        return x * 3
    with fd.trace_primitives() as log: assert fd.make_recomputed_in_gradient(f)(2.0) == 6.0
    assert len(runs) == 1 and log.count() == 0


def test_float32_example_prints_the_tutorials_figure():
    @fd.differentiable_function
    def cos(x):                                  # as the C library: computed in float64, rounded to float32
        c, s = np.cos(np.float64(x)), np.sin(np.float64(x))
        return np.float32(c), lambda g: -g * np.float32(s)
    square = fd.make_recomputed_in_gradient(lambda x: x * x)
    g = fd.gradient(lambda x: square(cos(x)), np.float32(10.0))
    assert type(g) is np.float32 and str(g) == '-0.9129453'


def test_model_and_input_gradients_match_the_plain_ones(any_backend):
    manual_seed(0)
    model, x = Affine(random_normal((3, 4)), random_normal(4)), random_normal((5, 3))
    recomputed = fd.make_recomputed_in_gradient(affine)
    want = fd.gradient(lambda m, x: affine(m, x).sum(), model, x)
    with fd.trace_primitives() as log: got = fd.gradient(lambda m, x: recomputed(m, x).sum(), model, x)
    assert log.count('forward', 'affine') == 2 and log.count('forward', 'tanh') == 1
    for a, b in zip((got[0].w, got[0].b, got[1]), (want[0].w, want[0].b, want[1])):
        np.testing.assert_array_equal(to_host(a), to_host(b))
    assert type(got[0]) is Affine and got[0].scale == 2


def test_static_and_keyword_arguments_ride_along():
    recomputed = fd.make_recomputed_in_gradient(lambda x, n, power=1: (x ** power) * n)
    g = fd.gradient(lambda x: recomputed(x, 3, power=2).sum(), np.arange(3.0))
    np.testing.assert_allclose(g, 6 * np.arange(3.0))


def test_structured_result_and_unused_outputs():
    both = fd.make_recomputed_in_gradient(lambda x: (np.sin(x), x * x))
    assert fd.gradient(lambda x: both(x)[1], 3.0) == pytest.approx(6.0)
    assert fd.gradient(lambda x: sum(both(x)), 3.0) == pytest.approx(np.cos(3.0) + 6.0)


def test_pullback_can_run_twice_and_recomputes_each_time():
    runs = []
    def f(x):
        runs.append(1)
        return np.exp(x)
    value, pb = fd.value_with_pullback(lambda x: fd.make_recomputed_in_gradient(f)(x), 1.0)
    assert pb(1.0) == pb(1.0) == pytest.approx(np.e)
    assert len(runs) == 3


def test_second_derivative_through_a_recomputed_function():
    s = fd.make_recomputed_in_gradient(lambda x: np.sin(x) * x)
    assert fd.gradient(fd.gradient(s), 1.0) == pytest.approx(2 * np.cos(1.0) - np.sin(1.0))


def test_with_recomputation_in_pullbacks_is_make_recomputed_applied():
    with fd.trace_primitives() as log:
        g = fd.gradient(lambda x: fd.with_recomputation_in_pullbacks(x, lambda y: (y * y).sum()), np.ones(3))
    np.testing.assert_array_equal(g, 2 * np.ones(3))
    assert log.count('forward', 'multiply') == 1 and log.count('forward', '<lambda>') == 2


# --- random numbers inside a recomputed region ------------------------------------------------------------
def _noisy_blocks(rng=None):
    "Blocks drawing from each kind of generator the replay covers (or from `rng`)."
    return {
        'fastad': lambda x: x * (random_normal(np.shape(x)) > 0).astype(x.dtype),
        'numpy legacy': lambda x: x * (np.random.rand(*np.shape(x)) > 0.5),
        'python random': lambda x: x * random.random(),
        'explicit': lambda x: x * (rng.standard_normal(np.shape(x)) > 0),
    }


@pytest.mark.parametrize('kind', ['fastad', 'numpy legacy', 'python random', 'explicit'])
def test_random_draws_repeat_so_gradients_are_exactly_the_plain_ones(kind):
    x = np.linspace(-1, 1, 50)
    def grad(checkpoint):
        manual_seed(3); np.random.seed(3); random.seed(3)
        rng = np.random.default_rng(3)
        block = _noisy_blocks(rng)[kind]
        run = (lambda x: fd.with_recomputation_in_pullbacks(x, block, generators=[rng])) if checkpoint else block
        loss = lambda x: np.tanh(run(x)).sum()
        return fd.gradient(loss, x)
    np.testing.assert_array_equal(grad(True), grad(False))


def test_an_explicit_generator_not_passed_in_is_not_replayed():
    "The replay covers the generators it knows; a private one must be passed, or the recomputation draws anew: an error."
    rng = np.random.default_rng(0)
    block = lambda x: x * rng.standard_normal(np.shape(x))
    x = np.ones(20)
    value, pb = fd.value_with_pullback(lambda x: fd.with_recomputation_in_pullbacks(x, block), x)
    with pytest.raises(DifferentiationError, match=r'generators=\[rng\]'): pb(np.ones(20))   # the recomputation differs


def test_the_backward_pass_leaves_the_generators_where_the_forward_pass_left_them():
    block = lambda x: x * random_normal(np.shape(x)) + np.random.rand() + random.random()
    manual_seed(5); np.random.seed(5); random.seed(5)
    fd.gradient(lambda x: fd.with_recomputation_in_pullbacks(x, block).sum(), np.ones(4))
    after = to_host(random_normal(2)), np.random.rand(), random.random()
    manual_seed(5); np.random.seed(5); random.seed(5)
    block(np.ones(4))                                       # one forward run, no recomputation
    np.testing.assert_array_equal(after[0], to_host(random_normal(2)))
    assert after[1:] == (np.random.rand(), random.random())


def test_dropout_under_the_strict_backend():
    with use_backend('strict'):
        x = random_normal((4, 3))
        block = lambda x: np.tanh(x) * (random_normal(np.shape(x)) > 0).astype(np.float32)
        manual_seed(1); g1 = fd.gradient(lambda x: fd.with_recomputation_in_pullbacks(x, block).sum(), x)
        manual_seed(1); g2 = fd.gradient(lambda x: block(x).sum(), x)
        np.testing.assert_array_equal(to_host(g1), to_host(g2))


def test_replaying_a_snapshot_repeats_draws_and_restores_afterwards():
    rng = np.random.default_rng(0)
    snap = fd.random_state([rng])
    first = rng.standard_normal(3)
    with fd.replaying(snap): again = rng.standard_normal(3)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(rng.standard_normal(3), np.random.default_rng(0).standard_normal(6)[3:])


# --- bad input ---------------------------------------------------------------------------------------------
def test_bad_input_gets_clear_errors():
    with pytest.raises(DifferentiationError, match='make_recomputed_in_gradient: f must be a function'):
        fd.make_recomputed_in_gradient(3)
    with pytest.raises(ArgumentError, match='cannot save the state of a list'):
        fd.random_state([[1, 2]])


# --- layers: ActivationDiscarding, checkpoint_sequential, plans for a budget ---------------------------------
import itertools
from fastad.checkpointing import (ActivationDiscarding, LayerCost, estimate, even_segments, plan_for_budget,
                                  measure_layers)
from fastad.memory import peak_bytes
import sys, threading, tracemalloc, warnings
from fastad import backend
from fastad.checkpointing import BudgetWarning
from fastad.memory import held_bytes
from fastad.checkpointing import CheckpointPlan, CheckpointedSequence


class Seq(fd.Layer):
    layers: list
    def forward(self, x): return fd.sequenced(x, through=self.layers)


def _deep(n=8, width=64, batch=256, seed=0):
    manual_seed(seed)
    return [fd.Dense(width, width, activation=np.tanh) for _ in range(n)], random_normal((batch, width))


def test_discarding_a_layer_gives_the_same_gradients_and_runs_it_twice(any_backend):
    layers, x = _deep(3, 16, 8)
    plain = fd.gradient(lambda m: m(x).sum(), Seq(layers))
    with fd.trace_primitives() as log:
        got = fd.gradient(lambda m: m(x).sum(), Seq([layers[0], layers[1].discarding_activations(), layers[2]]))
    assert log.count('forward', 'Dense') == 2
    assert type(got.layers[1]) is ActivationDiscarding
    np.testing.assert_array_equal(to_host(got.layers[1].wrapped.weight), to_host(plain.layers[1].weight))
    np.testing.assert_array_equal(to_host(got.layers[0].weight), to_host(plain.layers[0].weight))


def test_activation_discarding_takes_its_field_by_keyword_and_checks_it():
    layer = fd.Dense(2, 3)
    assert ActivationDiscarding(wrapped=layer).wrapped is layer
    assert layer.discarding_activations().wrapped is layer
    with pytest.raises(ArgumentError, match='ActivationDiscarding: wrapped must be a layer'):
        ActivationDiscarding(wrapped=3)


def test_cnn_gradients_with_and_without_discarding_are_equal():
    manual_seed(0)
    conv = fd.Conv2D(filter_shape=(5, 5, 3, 6))
    rest = [fd.MaxPool2D(pool_size=(2, 2), strides=(2, 2)), fd.Flatten(), fd.Dense(6 * 6 * 6, 10, activation=None)]
    x, labels = random_normal((10, 16, 16, 3)), np.arange(10)
    loss = lambda m: fd.softmax_cross_entropy(m(x), labels)
    with fd.trace_primitives() as log: got = fd.gradient(loss, Seq([conv.discarding_activations(), *rest]))
    want = fd.gradient(loss, Seq([conv, *rest]))
    assert log.count('forward', 'Conv2D') == 2
    np.testing.assert_array_equal(got.layers[0].wrapped.filter, want.layers[0].filter)
    np.testing.assert_array_equal(got.layers[3].weight, want.layers[3].weight)


@pytest.mark.parametrize('segments', [1, 3, 8])
def test_checkpoint_sequential_gives_the_plain_gradients(segments, any_backend):
    layers, x = _deep(8, 16, 8)
    want = fd.gradient(lambda m: m(x).sum(), Seq(layers))
    with fd.trace_primitives() as log:
        got = fd.gradient(lambda m: m(x).sum(), fd.checkpoint_sequential(layers, segments=segments))
    assert log.count('forward', 'segment') == 2 * segments
    for a, b in zip(got.layers, want.layers): np.testing.assert_array_equal(to_host(a.weight), to_host(b.weight))


def test_even_segments():
    assert even_segments(32, 6) == [(0, 6, True), (6, 12, True), (12, 17, True), (17, 22, True), (22, 27, True), (27, 32, True)]
    assert even_segments(3, 3) == [(0, 1, True), (1, 2, True), (2, 3, True)]


def test_segments_hold_less_after_the_forward_pass_and_peak_lower():
    layers, x = _deep(16, 128, 1024)                       # 512 KiB activations
    loss = lambda m: (m(x) ** 2).mean()
    plain, ckpt = Seq(layers), fd.checkpoint_sequential(layers, segments=4)
    assert fd.memory.held_bytes(loss, ckpt) <= 0.4 * fd.memory.held_bytes(loss, plain)
    assert peak_bytes(fd.gradient(loss), ckpt)[1] <= 0.7 * peak_bytes(fd.gradient(loss), plain)[1]


def _brute_force(costs, budget):
    "The fewest recomputed layers over every plan that recomputes each layer at most once."
    n, best = len(costs), None
    for cuts in itertools.product([0, 1], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        spans = list(zip(bounds, bounds[1:]))
        for flags in itertools.product([False, True], repeat=len(spans)):
            peak, recomputed = estimate(costs, [(s, e, r) for (s, e), r in zip(spans, flags)])
            if peak <= budget and (best is None or recomputed < best): best = recomputed
    return best


def test_the_plan_is_optimal_among_one_recomputation_plans():
    rng = random.Random(0)
    for _ in range(40):
        n = rng.randint(1, 7)
        costs = [LayerCost(rng.randint(1, 10) * 1000, rng.randint(0, 30) * 1000) for _ in range(n)]
        everything = estimate(costs, [(0, n, False)])[0]
        for budget in (everything, int(everything * 0.8), int(everything * 0.6), int(everything * 0.45)):
            want = _brute_force(costs, budget)
            if want is None:
                with pytest.raises(ArgumentError, match='no plan that recomputes each layer at most once fits'):
                    plan_for_budget(costs, budget)
                continue
            plan = plan_for_budget(costs, budget)
            assert [s for s, _, _ in plan] == sorted({s for s, _, _ in plan}) and plan[0][0] == 0 and plan[-1][1] == n
            peak, recomputed = estimate(costs, plan)
            assert peak <= budget and recomputed == want


def test_a_budget_plan_fits_when_measured_and_beats_or_equals_even_segments():
    layers, x = _deep(16, 128, 1024)
    loss = lambda m: (m(x) ** 2).mean()
    costs = measure_layers(layers, x)
    grads = sum(l.weight.nbytes + l.bias.nbytes for l in layers)
    for k in (2, 4):
        budget, even_recomputed = estimate(costs, even_segments(16, k))
        model = fd.checkpoint_sequential(layers, budget=int(budget))
        _, peak = peak_bytes(fd.gradient(loss), model)
        assert peak - grads <= budget, (k, peak - grads, budget)
        assert estimate(costs, model.plan.segments)[1] <= even_recomputed
    everything = estimate(costs, [(0, 16, False)])[0]
    # the model measures its layers again when it plans; a few per cent of room keeps a run whose second
    # measurement came out a little larger (a busy machine's allocator) from recomputing one layer
    assert fd.checkpoint_sequential(layers, budget=int(everything * 1.05)).plan.segments_for(layers, x) == [(0, 16, False)]


def test_the_estimate_bounds_the_measured_peak():
    layers, x = _deep(16, 128, 1024)
    loss = lambda m: (m(x) ** 2).mean()
    costs = measure_layers(layers, x)
    grads = sum(l.weight.nbytes + l.bias.nbytes for l in layers)
    for segments in ([(0, 16, False)], even_segments(16, 4), [(0, 8, True), (8, 16, False)]):
        model = CheckpointedSequence(layers=layers, plan=CheckpointPlan(segments=segments))
        _, peak = peak_bytes(fd.gradient(loss), model)
        assert peak - grads <= estimate(costs, segments)[0], segments


def test_checkpoint_sequential_refuses_bad_input():
    layers = [fd.Dense(2, 2)] * 3
    for kwargs, message in [(dict(), 'give either segments'), (dict(segments=2, budget=10), 'give either segments'),
                            (dict(segments=0), 'segments must be a whole number'), (dict(segments=4), '4 segments for 3 layers'),
                            (dict(budget=1.5), 'budget must be a whole number')]:
        with pytest.raises(ArgumentError, match=message): fd.checkpoint_sequential(layers, **kwargs)
    with pytest.raises(ArgumentError, match='layers must be a non-empty list'): fd.checkpoint_sequential([], segments=1)
    with pytest.raises(ArgumentError, match=r'layers\[1\] is a int'): fd.checkpoint_sequential([layers[0], 3], segments=1)
    with pytest.warns(fd.BudgetWarning, match='no plan that recomputes each layer at most once fits in 10 bytes'):
        fd.checkpoint_sequential(layers, budget=10)(np.ones((1, 2), dtype=np.float32))   # runs the smallest-peak plan


def test_a_recomputation_that_reorders_its_values_is_refused():
    rng = np.random.default_rng(3)                        # a generator of the user's, not named in generators=
    def shuffled(x): return x[rng.permutation(len(x))]
    w = np.arange(1., 7.)
    def loss(x): return (fd.with_recomputation_in_pullbacks(x, shuffled) * w).sum()
    with pytest.raises(DifferentiationError, match=r"\(the same sum, its values moved or changed\).*generators=\[rng\]"):
        fd.gradient(loss, np.arange(6.))                  # before: a gradient of another permutation, without a word
    rng, named = np.random.default_rng(3), np.random.default_rng(3)
    perm = named.permutation(6)
    def replayed(x): return (fd.with_recomputation_in_pullbacks(x, shuffled, generators=[rng]) * w).sum()
    grad = np.zeros(6); grad[perm] = w                    # x[perm] * w: x[perm[i]] gets w[i]
    np.testing.assert_array_equal(fd.gradient(replayed, np.arange(6.)), grad)


def _scipy(module):
    return pytest.importorskip(module, reason='SciPy is not installed (optional): pip install scipy')

def _special(): return _scipy('scipy.special')

ROUNDED_OTHERWISE = {   # fastad's rules compute these otherwise than SciPy/NumPy do: the same values but for rounding
    'logsumexp': lambda: (lambda ss: lambda x: ss.logsumexp(x, axis=1))(_special()),
    'softmax': lambda: (lambda ss: lambda x: ss.softmax(x, axis=1))(_special()),
    'log_softmax': lambda: (lambda ss: lambda x: ss.log_softmax(x, axis=1))(_special()),
    'norm.logpdf': lambda: _scipy('scipy.stats').norm.logpdf,
    'norm(x) * x': lambda: (lambda x: np.linalg.norm(x) * x)}

@pytest.mark.parametrize('name', ROUNDED_OTHERWISE)
@pytest.mark.parametrize('shape, scale', [((4, 5), 1.0), ((1, 7), 30.0), ((30, 40), 3.0)])
def test_a_recomputation_that_rounds_otherwise_is_accepted(name, shape, scale):
    f = ROUNDED_OTHERWISE[name]()
    x = np.random.default_rng(0).standard_normal(shape) * scale
    # before: DifferentiationError "(the same sum, its values moved or changed)", the check compared bits exactly
    got = fd.gradient(lambda x: np.sin(fd.make_recomputed_in_gradient(f)(x)).sum(), x)
    np.testing.assert_allclose(got, fd.gradient(lambda x: np.sin(f(x)).sum(), x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
def test_a_shuffle_of_a_large_array_is_refused_though_rounding_is_allowed(dtype):
    rng = np.random.default_rng(5)                        # not named in generators=
    k = (np.random.default_rng(0).standard_normal((67, 61)) * 10).astype(dtype)
    def shuffled(k): return k.reshape(-1)[rng.permutation(k.size)].reshape(k.shape)
    runs = []
    def rounded(k):                                       # the recomputation rounds otherwise: 4 ulps off
        runs.append(1)
        return k * dtype(1 + 4 * np.finfo(dtype).eps) if len(runs) > 1 else k
    for moved in (rounded, shuffled):
        def loss(x): return fd.with_recomputation_in_pullbacks(x, lambda x: (x * 1.0, moved(k)))[0].sum()
        if moved is rounded: np.testing.assert_array_equal(fd.gradient(loss, np.ones(3)), np.ones(3)); continue
        with pytest.raises(DifferentiationError, match=r"\(the same sum, its values moved or changed\)"):
            fd.gradient(loss, np.ones(3))


# ---- randomness, closures, forward rules, own generators, plans per shape, what a checkpoint keeps -----------------
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


# --- planning leaves randomness alone ----------------------------------------------------------------
def test_planning_a_budget_leaves_the_generators_alone():
    layers = [l for d in _dense(4) for l in (d, Dropout())]
    x = random_normal((8, 16))
    loss = lambda m: (m(x) ** 2).sum()
    manual_seed(4); want = fd.gradient(loss, Seq(layers)); after_plain = to_host(random_normal(3))
    manual_seed(4); got = fd.gradient(loss, fd.checkpoint_sequential(layers, budget=10 ** 9))   # plans here
    after_planned = to_host(random_normal(3))
    _equal(got, want)
    np.testing.assert_array_equal(after_planned, after_plain)


# --- closures in recomputed bodies -------------------------------------------------------------------
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


# --- what a checkpoint keeps alive --------------------------------------------------------------------
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


# --- the caller's tracemalloc, and threads ------------------------------------------------------------
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


# --- the rules of the forward pass ----------------------------------------------------------------
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


# --- generators of your own in the layer forms -----------------------------------------------------
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


# --- a plan per input shape --------------------------------------------------------------------------
@pytest.mark.slow   # measures two plans; test_a_budget_plan_fits_when_measured_and_beats_or_equals_even_segments measures one
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


# ---- the memory model: recomputing the last segment lowers no peak -------------------------------------------------
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


def _second_run_gives(first, second):
    "A body that returns `x * 1.0` and `first`, then `second` when it runs again (its recomputation)."
    runs = []
    def body(x):
        runs.append(1)
        return x * 1.0, (first if len(runs) == 1 else second)
    return lambda x: fd.with_recomputation_in_pullbacks(x, body)[0].sum()

F16 = np.array([1, 1.1, 1.2, 1.3], dtype=np.float16)
NOISE16 = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float16)

@pytest.mark.parametrize('first, second, message', [
    (NOISE16, np.random.default_rng(1).standard_normal((64, 64)).astype(np.float16), 'different value'),   # another draw
    (F16, F16 * np.float16(1.05), 'its sum differs'),
    (F16, F16[[0, 2, 1, 3]], 'the same sum, its values moved'),
    (F16, F16[[1, 0, 2, 3]], 'the same sum, its values moved'),
    (F16, F16[[3, 1, 2, 0]], 'the same sum, its values moved'),
    (np.array([1, np.nan, 3]), np.array([1, np.nan, 4]), 'its sum differs by 1'),
    (np.array([1, np.inf, 3]), np.array([6, np.inf, 3]), 'its sum differs by 5'),
    (np.array([1, np.nan, 3]), np.array([np.nan, 1, 3]), 'its NaN or infinite entries moved'),
    (np.array([1, np.inf, 3]), np.array([1, -np.inf, 3]), 'its NaN or infinite entries moved'),
    (np.array([1, np.inf, 3], dtype=np.float32), np.array([1, np.nan, 3], dtype=np.float32), 'its NaN or infinite entries moved')])
def test_a_float16_or_non_finite_recomputation_that_differs_is_refused(first, second, message):
    # before: each passed unnoticed (float16's tolerance was 6-40% of the magnitudes; a NaN or inf made every one NaN/inf)
    with pytest.raises(DifferentiationError, match=message): fd.gradient(_second_run_gives(first, second), np.ones(2))


@pytest.mark.parametrize('value', [F16, NOISE16, np.array([1, np.nan, 3]), np.array([[1, np.inf], [-np.inf, 2]], dtype=np.float32)])
def test_a_float16_or_non_finite_recomputation_that_repeats_is_accepted(value):
    np.testing.assert_array_equal(fd.gradient(_second_run_gives(value, value.copy()), np.ones(2)), np.ones(2))


def test_complex_values_are_checked_part_by_part():
    from fastad.checkpointing import _check_replayed, _fingerprint
    z = np.array([1 + 2j, np.nan + 1j, 3 - np.inf * 1j])
    _check_replayed('block', _fingerprint(z), z.copy())
    for other, message in ((z.conj(), 'its NaN or infinite entries moved'), (z + 0.5j, 'its sum differs')):
        with pytest.raises(DifferentiationError, match=message): _check_replayed('block', _fingerprint(z), other)
