"""Recomputation in pullbacks: what runs (counted), the gradients (equal to the plain ones, exactly, even with
random draws inside the recomputed region), structured arguments and results, and bad input."""
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
        from fastad.checkpointing import CheckpointPlan, CheckpointedSequence
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
