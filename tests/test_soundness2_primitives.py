"""Issue 17 ("Soundness 2"), the primitives' points: masks select (1), no silent derivative drops (5),
logsumexp at infinities (6), and fastad errors or NumPy's answers instead of raw exceptions (11)."""
import warnings
import numpy as np
import pytest
import fastad as fd
from fastad.testing import numerical_gradient
from fastad import primitives as P, engine as E, dispatch as D
from fastad.errors import FastADError, ShapeError
from fastad.transforms import ZeroDerivativeWarning

inf, nan = np.inf, np.nan

def grad(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')                # 1/0 and friends in the forward pass: the point is the gradient
        return fd.gradient(f, *args)

# 1. Masks select, never multiply. Each function is flat (or constant) where a 0 mask meets an infinite
# cotangent (sqrt at 0); the gradient there is 0, as in PyTorch (and JAX for np.where and relu), never NaN.
MASKS = {
    'where': (lambda x: np.sqrt(np.where(x > 0, x, 0)).sum(), [-1., 4.], [0., .25]),
    'where, y branch': (lambda x: np.sqrt(np.where(x <= 0, 0, x)).sum(), [-1., 4.], [0., .25]),
    'relu': (lambda x: np.sqrt(fd.relu(x)).sum(), [-1., 4.], [0., .25]),
    'maximum(x, 0)': (lambda x: np.sqrt(np.maximum(x, 0)).sum(), [-1., 4.], [0., .25]),
    'maximum(0, x)': (lambda x: np.sqrt(np.maximum(0, x)).sum(), [-1., 4.], [0., .25]),
    'maximum with a tie': (lambda x: np.sqrt(np.maximum(x, 0)).sum(), [-1., 0., 4.], [0., inf, .25]),
    'minimum': (lambda x: np.sqrt(-np.minimum(x, 0)).sum(), [1., -4.], [0., -.25]),
    'fmax': (lambda x: np.sqrt(np.fmax(x, 0)).sum(), [-1., 4.], [0., .25]),
    'fmin': (lambda x: np.sqrt(-np.fmin(x, 0)).sum(), [1., -4.], [0., -.25]),
    'clip below': (lambda x: np.sqrt(np.clip(x, 0, 9)).sum(), [-1., 4.], [0., .25]),
    'clip above': (lambda x: np.sqrt(9 - np.clip(x, 0, 9)).sum(), [10., 5.], [0., -.25]),
    'nan_to_num': (lambda x: np.sqrt(np.nan_to_num(x, posinf=0)).sum(), [inf, 4.], [0., .25]),
    'max (reduction)': (lambda x: np.sqrt(np.max(x)), [0., -1.], [inf, 0.]),
    'min (reduction)': (lambda x: np.sqrt(np.min(x)), [0., 1.], [inf, 0.]),
    'std of equal values': (lambda x: np.sqrt(np.std(x)), [1., 1.], [0., 0.]),
    'norm at 0': (lambda x: np.sqrt(np.linalg.norm(x)), [0., 0.], [0., 0.]),
    'hypot at 0': (lambda x: np.sqrt(np.hypot(x[0], x[1])), [0., 0.], [0., 0.]),
    'x ** 0': (lambda x: np.sqrt(x ** 0.0 - 1).sum(), [3., 2.], [0., 0.]),
    'x ** y, y = 0': (lambda x: np.sqrt(x ** np.array([0., 2.]) - 1).sum(), [3., 2.], [0., 2 / np.sqrt(3)]),
    'c ** y, c = 0': (lambda y: np.sqrt(np.array([0., 4.]) ** y).sum(), [2., 1.], [0., np.log(4)]),
    'float_power, c = 0': (lambda y: np.sqrt(np.float_power(np.array([0., 4.]), y)).sum(), [2., 1.], [0., np.log(4)]),
    'cumprod with a zero': (lambda x: np.sqrt(np.cumprod(x)[0]), [0., 5.], [inf, 0.]),
    'put_along_axis, overwritten': (lambda v: np.sqrt(fd.put_along_axis(np.ones(2), np.array([0, 0]), v, 0)).sum(),
                                    [1., 0.], [0., inf]),
    'median at a sample': (lambda x: np.sqrt(np.median(x)), [-1., 0., 1.], [0., inf, 0.]),      # JAX: the same
    'quantile, lower': (lambda x: np.sqrt(np.quantile(x, .5, method='lower')), [-1., 0., 1., 2.], [0., inf, 0., 0.]),
    'select': (lambda x: np.sqrt(np.select([x > 0], [x], 0.)).sum(), [-1., 4.], [0., .25]),
    'nanmax': (lambda x: np.sqrt(np.nanmax(x)), [0., nan, -1.], [inf, 0., 0.]),
}

@pytest.mark.parametrize('name', MASKS)
def test_masks_select_never_multiply(name):
    f, x, expected = MASKS[name]
    np.testing.assert_allclose(grad(f, np.array(x)), expected, rtol=1e-12)

def test_a_median_with_an_infinity_is_numpys():
    "0 * inf was NaN in the value too: the median of [1, inf, 2] is 2, not NaN."
    x = np.array([1., inf, 2.])
    value, g = fd.value_with_gradient(np.median, x)
    assert value == np.median(x) == 2.0
    np.testing.assert_array_equal(g, [0., 0., 1.])

@pytest.mark.parametrize('f', [fd.relu, lambda x: np.maximum(x, 0), lambda x: np.where(x > 0, x, 0),
                               lambda x: np.clip(x, -.5, .5), lambda x: np.minimum(x, 0), lambda x: np.fmax(x, 0)])
def test_selected_cotangents_keep_float32(f):
    x = np.array([-1., 0., .25, 2.], dtype=np.float32)
    g = fd.gradient(lambda x: f(x).sum(), x)
    assert g.dtype == np.float32

@pytest.mark.parametrize('f, expected', [(lambda x: np.where(x > 0, x ** 3, 0.), [0., 12., 18.]),
                                         (lambda x: np.maximum(x, 0) ** 3, [0., 12., 18.]),
                                         (lambda x: fd.relu(x) ** 3, [0., 12., 18.]),
                                         (lambda x: np.clip(x, -2, 2.5) ** 3, [-6., 12., 0.])])
def test_masks_at_second_order(f, expected):
    "The selecting chains differentiate again: the Hessian's diagonal (these Hessians are diagonal)."
    x = np.array([-1., 2., 3.])
    np.testing.assert_allclose(fd.gradient(lambda x: np.sum(fd.gradient(lambda x: np.sum(f(x)), x)), x), expected)

@pytest.mark.parametrize('seed', range(5))
def test_masked_rules_agree_with_finite_differences(seed):
    "Selecting instead of multiplying changes nothing where the cotangent is finite."
    r = np.random.default_rng(seed)
    x, y = r.standard_normal(6), r.standard_normal(6)
    c = r.standard_normal(6)
    fs = [lambda x: np.where(x > 0, x, y), lambda x: np.maximum(x, y), lambda x: np.minimum(y, x), fd.relu,
          lambda x: np.clip(x, -.5, .5), lambda x: np.fmax(x, y), lambda x: np.hypot(x, y), lambda x: x ** y.round(),
          lambda x: np.abs(x) ** y, lambda x: np.max(x) * x, lambda x: np.std(x) * x, lambda x: np.median(x) * x]
    for f in fs:
        g = fd.gradient(lambda x: np.sum(f(x) * c), x)
        num = numerical_gradient(lambda x: np.sum(f(x) * c), x)
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-6)

# 5. No silent derivative drops: np.unique, np.bincount(weights=), np.histogram(weights=) and its edges,
# np.heaviside in h now have derivatives; and the whole no-derivative table is walked below.

def numeric(f, x, eps=1e-6):
    x = np.asarray(x, dtype=float)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x); d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g

def test_bincount_weights_the_issues_example():
    i = np.array([0, 1, 1, 2])
    c = np.array([1.6, 2.6, 2.4])
    f = lambda w: np.sum(np.bincount(i, weights=w) * c)
    np.testing.assert_allclose(fd.gradient(f, np.ones(4)), [1.6, 2.6, 2.6, 2.4])
    w = np.array([.5, 1., 2., 4.], np.float32)
    value, _ = fd.value_with_pullback(lambda w: np.bincount(i, weights=w, minlength=5), w)
    np.testing.assert_array_equal(value, np.bincount(i, weights=w, minlength=5))
    assert value.dtype == np.float64                    # as NumPy, which sums weights in float64

def test_bincount_refuses_a_traced_index():
    with pytest.raises(FastADError, match=r"numpy.bincount: `x` cannot be differentiated"):
        fd.gradient(lambda x: np.sum(np.bincount(x)), np.array([0., 1.]))

@pytest.mark.parametrize('seed', range(4))
def test_unique_values_follow_x(seed):
    r = np.random.default_rng(seed)
    x = r.integers(0, 4, 7).astype(float) + r.standard_normal(7) * (seed % 2) * 1e-3   # repeats, or none
    c = r.standard_normal(np.unique(x).size)
    f = lambda x: np.sum(np.unique(x) * c)
    g = fd.gradient(f, x)
    first = np.unique(x, return_index=True)[1]
    expected = np.zeros(7); expected[first] = c          # each value's first occurrence gets its cotangent (JAX)
    np.testing.assert_allclose(g, expected)
    if seed % 2: np.testing.assert_allclose(g, numeric(f, x), atol=1e-6)

def test_unique_with_its_extras_and_an_axis():
    x = np.array([[1., 2.], [0., 5.], [1., 2.]])
    traced = E.Recording().new_input(x)
    mine = np.unique(traced, return_index=True, return_inverse=True, return_counts=True, axis=0)
    assert type(mine[0]) is E.Traced and all(type(m) is np.ndarray for m in mine[1:])   # plain indices and counts
    for mine, numpys in zip((E.unbox(mine[0]), *mine[1:]), np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=0)):
        np.testing.assert_array_equal(mine, numpys)
    g = fd.gradient(lambda x: np.sum(np.unique(x, axis=0) * [[1., 2.], [3., 4.]]), x)
    np.testing.assert_array_equal(g, [[3., 4.], [1., 2.], [0., 0.]])

@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('density', [False, True])
@pytest.mark.parametrize('bins', [4, 'edges', 'auto', 'range'])
def test_histogram_weights_and_edges(seed, density, bins):
    r = np.random.default_rng(seed)
    a, w = r.standard_normal(12), r.uniform(.5, 2, 12)
    kw = dict(bins=np.array([-1., -.2, .3, 2.]), density=density) if bins == 'edges' else \
         dict(bins=4, range=(-1., 1.5), density=density) if bins == 'range' else dict(bins=bins, density=density)
    if bins == 'auto': w = None                         # NumPy estimates bins from unweighted data only
    ch, ce = r.standard_normal(len(np.histogram(a, **kw)[0])), r.standard_normal(len(np.histogram(a, **kw)[1]))
    f = lambda a, w: np.sum(np.histogram(a, weights=w, **kw)[0] * ch) + np.sum(np.histogram(a, weights=w, **kw)[1] * ce)
    with warnings.catch_warnings():                    # fixed edges: a's gradient is zero, and fastad says so
        warnings.simplefilter('ignore', ZeroDerivativeWarning)
        value, ga = fd.value_with_gradient(lambda a: f(a, w), a)
    np.testing.assert_allclose(value, f(a, w))
    np.testing.assert_allclose(ga, numeric(lambda a: f(a, w), a), atol=1e-5)
    if w is not None: np.testing.assert_allclose(fd.gradient(lambda w: f(a, w), w), numeric(lambda w: f(a, w), w), atol=1e-5)
    hist, edges = np.histogram(E.Recording().new_input(a), weights=w, **kw)
    numpys = np.histogram(a, weights=w, **kw)
    np.testing.assert_allclose(E.unbox(hist), numpys[0]); np.testing.assert_allclose(E.unbox(edges), numpys[1])

def test_histogram_of_equal_values_and_outside_the_range():
    a = np.array([2., 2., 2.])
    np.testing.assert_allclose(fd.gradient(lambda a: np.sum(np.histogram(a, bins=3)[1]), a), [4 / 3] * 3)  # edges 1.5 .. 2.5
    a, w = np.array([-5., 0.1, 0.2, 5.]), np.ones(4)
    np.testing.assert_array_equal(fd.gradient(lambda w: np.sum(np.histogram(a, bins=2, range=(0., 1.), weights=w)[0]), w),
                                  [0., 1., 1., 0.])

def test_heaviside_in_h():
    x = np.array([-1., 0., 2., 0.])
    g = fd.gradient(lambda h: np.sum(np.heaviside(x, h) * [1., 2., 3., 4.]), np.array([.5, .5, .5, .5]))
    np.testing.assert_array_equal(g, [0., 2., 0., 4.])
    np.testing.assert_array_equal(fd.gradient(lambda x: np.sum(np.heaviside(x, .5)), x), np.zeros(4))
    np.testing.assert_array_equal(fd.gradient(lambda h: np.sum(np.heaviside(x, h)), .5), 2.)   # broadcast back

# The walk: each entry of the no-derivative table, called on random inputs; for each float argument, a small
# step either way must leave the result exactly as it was. A new entry fails here until it has a recipe.
rng = np.random.default_rng(17)
u = lambda *shape: rng.uniform(-3, 3, shape)
RECIPES = {
    np.shape: lambda: ((u(3, 4),), {}), np.ndim: lambda: ((u(3, 4),), {}), np.size: lambda: ((u(3, 4),), {}),
    np.result_type: lambda: ((u(3), 1.5), {}), np.zeros_like: lambda: ((u(3),), {}), np.ones_like: lambda: ((u(3),), {}),
    np.empty_like: lambda: ((u(3),), {}),
    np.argmax: lambda: ((u(3, 4),), dict(axis=1)), np.argmin: lambda: ((u(3, 4),), {}), np.argsort: lambda: ((u(5),), {}),
    np.isfinite: lambda: ((u(4),), {}), np.isnan: lambda: ((u(4),), {}), np.isinf: lambda: ((u(4),), {}),
    np.sign: lambda: ((u(4),), {}), np.floor: lambda: ((u(4),), {}), np.ceil: lambda: ((u(4),), {}),
    np.round: lambda: ((u(4),), dict(decimals=1)), np.around: lambda: ((u(4),), {}), np.rint: lambda: ((u(4),), {}),
    np.trunc: lambda: ((u(4),), {}), np.fix: lambda: ((u(4),), {}),
    np.equal: lambda: ((u(4), u(4)), {}), np.not_equal: lambda: ((u(4), u(4)), {}), np.less: lambda: ((u(4), u(4)), {}),
    np.less_equal: lambda: ((u(4), u(4)), {}), np.greater: lambda: ((u(4), u(4)), {}),
    np.greater_equal: lambda: ((u(4), u(4)), {}),
    np.logical_and: lambda: ((u(4), u(4)), {}), np.logical_or: lambda: ((u(4), u(4)), {}),
    np.logical_not: lambda: ((u(4),), {}), np.logical_xor: lambda: ((u(4), u(4)), {}),
    np.allclose: lambda: ((u(4), u(4)), {}), np.isclose: lambda: ((u(4), u(4)), {}),
    np.array_equal: lambda: ((u(4), u(4)), {}), np.array_equiv: lambda: ((u(4), u(4)), {}),
    np.count_nonzero: lambda: ((u(4),), {}), np.nonzero: lambda: ((u(4),), {}), np.flatnonzero: lambda: ((u(4),), {}),
    np.floor_divide: lambda: ((u(4), u(4)), {}),
    np.bitwise_and: lambda: ((rng.integers(0, 9, 4), rng.integers(0, 9, 4)), {}),
    np.bitwise_or: lambda: ((rng.integers(0, 9, 4), rng.integers(0, 9, 4)), {}),
    np.invert: lambda: ((rng.integers(0, 9, 4),), {}),
    np.signbit: lambda: ((u(4),), {}), np.isneginf: lambda: ((u(4),), {}), np.isposinf: lambda: ((u(4),), {}),
    np.isreal: lambda: ((u(4),), {}), np.iscomplex: lambda: ((u(4),), {}), np.spacing: lambda: ((u(4),), {}),
    np.argpartition: lambda: ((u(6),), dict(kth=2)),
    np.searchsorted: lambda: ((np.sort(u(6)), u(4)), {}), np.digitize: lambda: ((u(6), np.sort(u(4))), {}),
    np.nanargmax: lambda: ((u(5),), {}), np.nanargmin: lambda: ((u(5),), {}),
    np.isin: lambda: ((u(5), u(3)), {}), np.lexsort: lambda: ((u(2, 5),), {}),
    np.linalg.matrix_rank: lambda: ((u(3, 4),), {}),
    # were in the table and moved with a float input: kept, so that the walk finds them against older code
    np.unique: lambda: ((np.round(u(8)),), {}), np.heaviside: lambda: ((np.array([-1., 0., 2.]), u(3)), {}),
    np.bincount: lambda: ((rng.integers(0, 4, 6),), dict(weights=u(6))),
    np.histogram: lambda: ((u(10),), dict(bins=3, weights=u(10))),
}

def flat(result):
    "A result as one float vector (shapes, dtypes, tuples of arrays), for exact comparison."
    if isinstance(result, tuple) and not hasattr(result, 'dtype'): return np.concatenate([flat(r) for r in result] or [np.zeros(0)])
    if isinstance(result, np.dtype): return np.array([result.num], float)
    return np.ravel(np.asarray(result)).astype(float)

def plain_entries():
    registered = set(P.REGISTRY)
    return sorted(P.NONDIFFERENTIABLE - registered, key=D._public_name)

@pytest.mark.parametrize('f', plain_entries(), ids=D._public_name)
def test_no_derivative_table_is_piecewise_constant(f):
    assert f in RECIPES, f"{D._public_name(f)} is run without a derivative: add a recipe to RECIPES to check that it may be"
    for trial in range(3):
        args, kwargs = RECIPES[f]()
        if f is np.empty_like: continue                 # its contents are whatever memory held: nothing to compare
        base = flat(f(*args, **kwargs))
        slots = [('arg', i) for i, a in enumerate(args) if np.asarray(a).dtype.kind == 'f'] + \
                [('kw', k) for k, a in kwargs.items() if np.asarray(a).dtype.kind == 'f']
        for where, key in slots:
            for step in (1e-6, -1e-6):
                a2, k2 = list(args), dict(kwargs)
                held = a2 if where == 'arg' else k2
                held[key] = held[key] + step * rng.standard_normal(np.shape(held[key]))
                moved = flat(f(*a2, **k2))
                assert np.array_equal(base, moved, equal_nan=True), \
                    f"{D._public_name(f)} moves with its float argument {key!r}: it needs a derivative, not the table"

def test_every_plain_entry_runs_on_traced_values():
    "The engine runs each entry on the plain values underneath, giving NumPy's result."
    for f in plain_entries():
        args, kwargs = RECIPES[f]()
        if f is np.empty_like: continue
        first = next(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == 'f') if \
            any(np.asarray(a).dtype.kind == 'f' for a in args) else None
        if first is None: continue
        result = f(*args[:first], E.Recording().new_input(args[first]), *args[first + 1:], **kwargs)
        np.testing.assert_array_equal(flat(result), flat(f(*args, **kwargs)))

# 6. Infinities in logsumexp: as SciPy (values) and JAX (gradients: e^(x - result), NaN where undefined).
LSE = [([-inf, -inf], -inf, [nan, nan]), ([inf, 1.], inf, [nan, 0.]), ([-inf, 0.], 0., [0., 1.]),
       ([inf, inf], inf, [nan, nan]), ([inf, -inf], inf, [nan, 0.]), ([-inf, 0., 0.], np.log(2), [0., .5, .5])]

@pytest.mark.parametrize('x, value, gradient', LSE)
def test_logsumexp_at_infinities(x, value, gradient):
    scipy = pytest.importorskip('scipy.special')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        v, g = fd.value_with_gradient(fd.logsumexp, np.array(x))
    assert v == value == scipy.logsumexp(x)
    np.testing.assert_array_equal(g, gradient)

def test_logsumexp_rows_with_infinities_leave_other_rows_alone():
    x = np.array([[-inf, -inf], [1., 2.], [inf, 0.]])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        v, pb = fd.value_with_pullback(lambda x: fd.logsumexp(x, axis=1, keepdims=True), x)
        g = pb(np.ones((3, 1)))
    np.testing.assert_array_equal(v[:, 0], [-inf, np.logaddexp(1., 2.), inf])
    np.testing.assert_allclose(g[1], np.exp(x[1] - np.logaddexp(1., 2.)))
    assert np.isnan(g[0]).all() and np.isnan(g[2, 0]) and g[2, 1] == 0

# 11. Raw exceptions on input NumPy accepts.
def test_put_along_axis_with_axis_none():
    arr, idx = np.arange(6.).reshape(2, 3), np.array([4, 0])
    expected = arr.copy(); np.put_along_axis(expected, idx, [10., 20.], None)
    value, _ = fd.value_with_pullback(lambda a, v: fd.put_along_axis(a, idx, v, axis=None), arr, np.array([10., 20.]))
    np.testing.assert_array_equal(value, expected)
    ga, gv = fd.gradient(lambda a, v: np.sum(fd.put_along_axis(a, idx, v, axis=None) * np.arange(1., 7.).reshape(2, 3)),
                         arr, np.array([10., 20.]))
    np.testing.assert_array_equal(ga, [[0., 2., 3.], [4., 0., 6.]])
    np.testing.assert_array_equal(gv, [5., 1.])
    np.testing.assert_array_equal(fd.put_along_axis(arr, idx, 7., axis=None), np.where(np.isin(np.arange(6), idx), 7., arr.ravel()).reshape(2, 3))
    with pytest.raises(ShapeError, match="axis=None, `indices` must be 1-D"):
        fd.put_along_axis(arr, idx[None], 7., axis=None)

@pytest.mark.parametrize('shape, axis', [((0, 3), 0), ((0, 3), None), ((2, 0), 1), ((0, 3), 1), ((2, 0, 3), (0, 1))])
def test_median_over_an_empty_axis_is_numpys(shape, axis):
    x = np.ones(shape)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        expected = np.median(x, axis=axis)
        v, pb = fd.value_with_pullback(lambda x: np.median(x, axis=axis), x)
        g = pb(np.ones(np.shape(expected)))
    np.testing.assert_array_equal(v, expected)
    assert np.shape(g) == shape

def test_median_over_an_empty_axis_warns_as_numpy():
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        fd.value_with_gradient(lambda x: np.median(x, axis=0).sum(), np.ones((0, 3)))

def test_quantile_over_an_empty_axis_is_a_fastad_error():
    with pytest.raises(ShapeError, match="numpy.quantile: the quantile of an empty axis"):
        fd.gradient(lambda x: np.quantile(x, .3, axis=0).sum(), np.ones((0, 3)))

@pytest.mark.parametrize('shape', [(0, 3), (3, 0), (0, 0), (2, 0, 3)])
@pytest.mark.parametrize('full', [False, True])
def test_svd_of_an_empty_matrix(shape, full):
    a = np.ones(shape)
    result, pb = fd.value_with_pullback(lambda a: np.linalg.svd(a, full_matrices=full), a)
    u, s, vh = result
    for mine, numpys in zip(result, np.linalg.svd(a, full_matrices=full)): np.testing.assert_array_equal(mine, numpys)
    ga = pb(type(result)(np.zeros(np.shape(u)), np.ones(np.shape(s)), np.zeros(np.shape(vh))))
    assert ga.shape == shape and not ga.any()
    assert fd.gradient(lambda a: np.sum(np.linalg.svd(a, compute_uv=False)), a).shape == shape
