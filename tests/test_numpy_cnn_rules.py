"""The rules a CNN written in plain NumPy runs through: `einsum` and its pullback, `sliding_window_view`
and its pullback, `max`/`min` over several axes with ties, and a bias's cotangent. Each against central differences
or an independent reference, first and second order; and the learner's whole step against the hand-written one."""
import sys
from pathlib import Path
import numpy as np, pytest
from numpy.lib.stride_tricks import sliding_window_view
import fastad as fd
from fastad import primitives as P, primitives_more as PM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

def check_pullback(f, *xs, eps=1e-6, tol=1e-6, seed=0):
    "fd.value_with_pullback(f, *xs) against central differences along a random direction, for a random cotangent."
    rng = np.random.default_rng(seed)
    xs = [np.asarray(x, np.float64) for x in xs]
    value, pb = fd.value_with_pullback(f, *xs)
    np.testing.assert_allclose(value, f(*xs), rtol=1e-12, atol=1e-12)       # the traced value is the plain one
    v = rng.standard_normal(np.shape(value))
    grads = pb(v) if len(xs) > 1 else (pb(v),)
    for i, (x, g) in enumerate(zip(xs, grads)):
        assert np.shape(g) == x.shape and g.dtype == np.float64, (i, np.shape(g), x.shape)
        d = rng.standard_normal(x.shape)
        def directional(t): return float(np.sum(v * f(*xs[:i], x + t * d, *xs[i + 1:])))
        numeric = (directional(eps) - directional(-eps)) / (2 * eps)
        assert abs(float(np.sum(g * d)) - numeric) <= tol * max(1.0, abs(numeric)), (i, float(np.sum(g * d)), numeric)

def check_second_order(f, x, eps=1e-5, tol=1e-6, seed=1):
    "A Hessian-vector product (the pullback of a pullback) against central differences of the gradient."
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(x.shape)
    hv = fd.hessian_vector_product(f, x, v)
    grad = fd.gradient(f)
    numeric = (grad(x + eps * v) - grad(x - eps * v)) / (2 * eps)
    np.testing.assert_allclose(hv, numeric, rtol=tol, atol=tol * max(1.0, np.abs(numeric).max()))

# ---------------------------------------------------------------------------------------------------- einsum

EINSUM = [('ij,jk->ik', (3, 4), (4, 2)), ('bij,bjk->bik', (2, 3, 4), (2, 4, 5)), ('ij,ij->', (3, 4), (3, 4)),
          ('ij,ij->ij', (3, 4), (3, 4)), ('i,j->ij', (3,), (2,)), ('ij,kj->i', (3, 4), (2, 4)), ('ab,bc->', (2, 3), (3, 4)),
          ('ij,jk->ki', (3, 4), (4, 2)), ('bji,bkj->kbi', (2, 4, 3), (2, 5, 4)), ('i,->i', (3,), ()), ('ba,c', (2, 3), (4,)),
          # a letter repeated within one operand (a diagonal), and across three operands
          ('ii->i', (3, 3)), ('ii->', (3, 3)), ('ii', (3, 3)), ('iij,j->i', (3, 3, 2), (2,)), ('iji,jj->ij', (3, 2, 3), (2, 2)),
          ('ij,ii->j', (3, 2), (3, 3)), ('i,i,i->i', (4,), (4,), (4,)), ('ij,jk,kl->il', (2, 3), (3, 4), (4, 2)),
          # ellipses: on both sides, on one side, broadcasting, alone
          ('...ij,...jk->...ik', (2, 3, 4), (2, 4, 5)), ('...ij,...jk->...ik', (2, 3, 4), (4, 5)),
          ('...i,...i->...', (2, 3), (3,)), ('i...->...', (3, 2, 2)), ('...,...->...', (2, 3), (2, 3)),
          ('...ij,...jk', (1, 3, 4), (2, 4, 5)), ('i...j,j->...i', (2, 3, 4), (4,)),
          # a size-1 axis that broadcasts against a longer one (the unplanned path)
          ('ij,ij->ij', (1, 4), (3, 4)), ('ij,jk->ik', (3, 1), (4, 2))]

@pytest.mark.parametrize('spec', EINSUM, ids=[f"{e[0]} {e[1:]}" for e in EINSUM])
def test_einsum_pullback_against_central_differences(spec):
    subscripts, *shapes = spec
    r = np.random.default_rng(4)
    check_pullback(lambda *xs: np.einsum(subscripts, *xs), *(r.standard_normal(s) for s in shapes))
    check_pullback(lambda *xs: np.einsum(subscripts, *xs, optimize=True), *(r.standard_normal(s) for s in shapes))

@pytest.mark.parametrize('subscripts, shapes', [('ij,jk->ik', [(3, 4), (4, 3)]), ('i,ij,j->', [(3,), (3, 3), (3,)]),
                                                ('bij,bjk->bik', [(2, 3, 3), (2, 3, 3)]), ('ii,i->i', [(3, 3), (3,)])])
def test_einsum_second_order(subscripts, shapes):
    "The chains are traced-friendly: differentiating them again gives the Hessian."
    r = np.random.default_rng(5)
    consts = [r.standard_normal(s) for s in shapes]
    x = r.standard_normal(shapes[0])
    def f(x):                                           # x in every operand that has its shape: a product of x with itself
        ops = [x if s == shapes[0] else c for s, c in zip(shapes, consts)]
        return np.sum(np.tanh(np.einsum(subscripts, *ops)))
    check_second_order(f, x)

def test_two_operand_einsum_and_its_pullback_run_matrix_products(monkeypatch):
    """No unplanned np.einsum loop in the pullback of a product of two operands (the conv over windows: 826 µs), nor
    in its forward pass when the call asks for a planned einsum; unplanned, the value is NumPy's own, bit for bit."""
    plain, real = [], np.einsum
    def counting(*args, **kwargs):
        if not any(hasattr(type(a), '__fastad_primitive__') for a in args): plain.append((args[0], kwargs.get('optimize', False)))
        return real(*args, **kwargs)
    monkeypatch.setattr(np, 'einsum', counting)
    r = np.random.default_rng(6)
    x, w = r.standard_normal((2, 6, 6, 3)), r.standard_normal((3, 3, 3, 4))
    windows = sliding_window_view(x, (3, 3), axis=(1, 2))
    for optimize in (True, False):
        plain.clear()
        conv = lambda w: np.einsum('nhwcij,ijcf->nhwf', windows, w, optimize=optimize)
        value, pb = fd.value_with_pullback(conv, w)
        forward = list(plain)
        g = pb(r.standard_normal(value.shape))
        assert plain == forward == ([] if optimize else [('nhwcij,ijcf->nhwf', False)])
        np.testing.assert_allclose(value, real('nhwcij,ijcf->nhwf', windows, w), rtol=1e-12)
        if not optimize: np.testing.assert_array_equal(value, real('nhwcij,ijcf->nhwf', windows, w))

def test_einsum_values_and_types_are_numpys():
    r = np.random.default_rng(7)
    a32, b32 = r.standard_normal((4, 5), dtype=np.float32), r.standard_normal((5, 3), dtype=np.float32)
    value, pb = fd.value_with_pullback(lambda a, b: np.einsum('ij,jk->ik', a, b), a32, b32)
    np.testing.assert_allclose(value, np.einsum('ij,jk->ik', a32, b32), rtol=1e-6)
    assert value.dtype == np.float32 and all(g.dtype == np.float32 for g in pb(np.ones((4, 3), np.float32)))
    a, b = r.standard_normal(3), r.standard_normal(3)
    v = fd.value_with_gradient(lambda a: np.einsum('i,i->', a, b), a)[0]
    assert type(v) is type(np.einsum('i,i->', a, b)) and np.isclose(v, a @ b)        # a NumPy number, as np.einsum's
    m = r.standard_normal((3, 4))
    value = fd.value_with_pullback(lambda m: np.einsum('ij,kj->ki', m, m, optimize=True), m)[0]   # laid out as NumPy's
    np.testing.assert_allclose(value, np.einsum('ij,kj->ki', m, m), rtol=1e-12)
    with pytest.raises(ValueError):                   # what NumPy refuses is still refused, by NumPy
        fd.gradient(lambda a: np.einsum('ij,jk->il', a, a).sum(), np.ones((2, 2)))
    with pytest.raises(ValueError):
        fd.gradient(lambda a: np.einsum('ijk,jk->i', a, a).sum(), np.ones((2, 2)))

def test_convolution_as_einsum_over_traced_windows_matches_im2col():
    "The learner's convolution with the input traced too: through sliding_window_view, against the GEMM form."
    r = np.random.default_rng(8)
    x, w = r.standard_normal((2, 7, 6, 2)), r.standard_normal((3, 2, 2, 4))
    def by_einsum(x, w): return np.einsum('nhwcij,ijcf->nhwf', sliding_window_view(x, (3, 2), axis=(1, 2)), w)
    def by_gemm(x, w):
        cols = sliding_window_view(x, (3, 2), axis=(1, 2)).transpose(0, 1, 2, 4, 5, 3).reshape(2 * 5 * 5, 12)
        return (cols @ w.reshape(12, 4)).reshape(2, 5, 5, 4)
    check_pullback(by_einsum, x, w)
    loss = lambda f: (lambda x, w: np.sum(np.sin(f(x, w))))
    for g1, g2 in zip(fd.gradient(loss(by_einsum), x, w), fd.gradient(loss(by_gemm), x, w)):
        np.testing.assert_allclose(g1, g2, rtol=1e-12, atol=1e-12)

# ---------------------------------------------------------------------------------------------------- windows

WINDOWS = [(3, 0), (2, -1), ((2, 3), (1, 2)), ((3, 2), (2, 0)), ((2, 2, 2), None), ((1, 1), (0, 1)), ((4,), (0,)),
           ((2, 1, 3), (0, 1, 2)), ((7,), (2,))]

def windows_reference(x_shape, g, window_shape, axis):
    "sliding_window_view's transpose by np.add.at over every element's index in every window: an independent oracle."
    index = sliding_window_view(np.arange(np.prod(x_shape)).reshape(x_shape), window_shape, axis)
    out = np.zeros(np.prod(x_shape))
    np.add.at(out, index.ravel(), np.asarray(g).ravel())
    return out.reshape(x_shape)

@pytest.mark.parametrize('window_shape, axis', WINDOWS, ids=[str(w) for w in WINDOWS])
def test_sliding_window_view_gradients(window_shape, axis):
    r = np.random.default_rng(9)
    x = r.standard_normal((4, 5, 7))
    f = lambda x: np.lib.stride_tricks.sliding_window_view(x, window_shape, axis=axis)
    check_pullback(f, x)
    value, pb = fd.value_with_pullback(f, x)
    g = r.standard_normal(np.shape(value))
    np.testing.assert_allclose(pb(g), windows_reference(x.shape, g, window_shape, axis), rtol=1e-12, atol=1e-12)
    check_second_order(lambda x: np.sum(np.sin(f(x)) * f(x)), x)

def test_window_sum_of_a_broadcast_cotangent_counts_windows():
    "`.sum()` hands back a read-only broadcast cotangent: each element gets the number of windows it is in."
    x = np.zeros((3, 6), np.float32)
    g = fd.gradient(lambda x: sliding_window_view(x, (2, 3), axis=(0, 1)).sum(), x)
    test = np.outer([1, 2, 1], [1, 2, 3, 3, 2, 1])
    np.testing.assert_array_equal(g, test)
    assert g.dtype == np.float32

def test_window_sum_is_the_transpose_of_sliding_window_view():
    "<window_sum(g), h> == <g, windows(h)> for random g, h: the adjoint identity, for an empty window too."
    r = np.random.default_rng(10)
    for window_shape, axis in WINDOWS[:-1] + [((), ())]:
        h = r.standard_normal((4, 5, 7))
        windows = sliding_window_view(h, window_shape, axis) if axis is not None else sliding_window_view(h, window_shape)
        ax = tuple(range(3)) if axis is None else ((axis,) if np.ndim(axis) == 0 else axis)
        ws = (window_shape,) if np.ndim(window_shape) == 0 else window_shape
        g = r.standard_normal(windows.shape)
        back = PM.window_sum(g, shape=h.shape, window_shape=ws, axis=tuple(a % 3 for a in ax))
        assert np.isclose(np.sum(back * h), np.sum(g * windows), rtol=1e-12)

# ---------------------------------------------------------------------------------------------------- max and min

def extremum_reference(x, axis, g, pick):
    "The rule, one slice at a time: the cotangent shared equally among the equal extremes of each slice."
    axes = tuple(a % x.ndim for a in axis)
    moved = np.moveaxis(x, axes, tuple(range(x.ndim - len(axes), x.ndim)))
    flat = moved.reshape(moved.shape[:x.ndim - len(axes)] + (-1,))
    out = np.zeros_like(flat)
    gs = np.asarray(g).reshape(flat.shape[:-1])
    for i in np.ndindex(flat.shape[:-1]):
        hits = flat[i] == pick(flat[i])
        out[i][hits] = gs[i] / hits.sum()
    return np.moveaxis(out.reshape(moved.shape), tuple(range(x.ndim - len(axes), x.ndim)), axes)

@pytest.mark.parametrize('reduce, pick', [(np.max, np.max), (np.min, np.min)])
@pytest.mark.parametrize('axis', [(2, 4), (-1, -3), (1,), (0, 2, 4), (5,)])
@pytest.mark.parametrize('keepdims', [False, True])
@pytest.mark.parametrize('ties', [False, True])
def test_max_and_min_over_several_axes(reduce, pick, axis, keepdims, ties):
    "Pooling written as reshape(...).max(axis=(2, 4)): values as NumPy's, ties share the cotangent equally."
    r = np.random.default_rng(11)
    x = (r.integers(0, 3, (3, 4, 2, 4, 2, 5)) if ties else r.standard_normal((3, 4, 2, 4, 2, 5))).astype(np.float64)
    value, pb = fd.value_with_pullback(lambda x: reduce(x, axis=axis, keepdims=keepdims), x)
    np.testing.assert_array_equal(value, reduce(x, axis=axis, keepdims=keepdims))
    g = r.standard_normal(np.shape(value))
    np.testing.assert_allclose(pb(g), extremum_reference(x, axis, g, pick), rtol=1e-12, atol=1e-15)
    if not ties: check_pullback(lambda x: reduce(x, axis=axis, keepdims=keepdims), x)

def test_max_over_short_axes_by_slices_is_numpys_max():
    "The slices give exactly NumPy's reduction, NaN included, for floats and integers; a bad axis is NumPy's error."
    r = np.random.default_rng(12)
    for dtype in (np.float32, np.float64, np.int64):
        x = (r.standard_normal((6, 3, 8, 2, 5)) * 10).astype(dtype)
        if dtype != np.int64: x[1, 2, 3, 1, 4] = np.nan
        for axis in [(1,), (3,), (1, 3), (-1,), (1, -2), (0,)]:
            for pick, reduce in ((np.maximum, np.max), (np.minimum, np.min)):
                got = P._by_slices(pick, x, axis)
                if got is not None: np.testing.assert_array_equal(got, reduce(x, axis=axis, keepdims=True))
    assert P._by_slices(np.maximum, np.ones((10, 10)), (1,)) is None          # few results per slice: NumPy's own
    assert P._by_slices(np.maximum, np.ones((100, 40)), (1,)) is None         # many slices
    for bad in [(3,), (0, 0), (-4,)]:
        with pytest.raises((ValueError, np.exceptions.AxisError)):
            fd.gradient(lambda x: x.max(axis=bad).sum(), np.ones((8, 2, 3)))

def test_max_without_ties_counts_no_hits(monkeypatch):
    "Without ties (almost always), max keeps one mask and neither counts the hits per slice nor divides."
    x = np.random.default_rng(13).standard_normal((4, 3, 2, 3, 2, 5))
    calls, real = [], np.sum
    monkeypatch.setattr(np, 'sum', lambda *a, **k: calls.append(1) or real(*a, **k))
    value, chain = P.max_vwc(x, axis=(2, 4))
    g = chain(np.ones_like(value))
    assert calls == []
    np.testing.assert_array_equal(g, x == x.max(axis=(2, 4), keepdims=True))

def test_max_with_nan_and_precision():
    x = np.array([[1., np.nan, 3.], [2., 5., 5.]], np.float32)
    with np.errstate(all='raise'):                                  # and no warning of a 0 / 0 on the way
        value, pb = fd.value_with_pullback(lambda x: np.max(x, axis=1), x)
        g = pb(np.ones(2, np.float32))
    np.testing.assert_array_equal(value, [np.nan, 5.])
    np.testing.assert_array_equal(g, [[0, 0, 0], [0, .5, .5]])      # a NaN maximum: no element is it; a tie: halves
    assert g.dtype == np.float32
    y = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert fd.gradient(lambda y: y.max(axis=(1, 2)).sum(), y).dtype == np.float32
    _, chain = P.max_vwc(y)
    assert chain(1.0).dtype == np.float32                            # a Python float cotangent: x's precision
    v = fd.value_with_gradient(lambda y: y.max(axis=(0, 1, 2)), y)[0]
    assert type(v) is np.float32 and v == 23                         # a number, as np.max gives

# ---------------------------------------------------------------------------------------------------- bias

def test_bias_cotangent_is_one_matrix_vector_product(monkeypatch):
    r = np.random.default_rng(14)
    g = r.standard_normal((10, 12, 12, 6)).astype(np.float32)
    calls, real = [], np.sum
    monkeypatch.setattr(np, 'sum', lambda *a, **k: calls.append(1) or real(*a, **k))
    got = P.unbroadcast(g, (6,))
    assert calls == []
    monkeypatch.setattr(np, 'sum', real)
    np.testing.assert_allclose(got, g.astype(np.float64).sum((0, 1, 2)), rtol=1e-5, atol=1e-4)
    assert got.dtype == np.float32 and got.shape == (6,)
    for g, shape in [(g, (1, 12, 6)), (g.transpose(3, 0, 1, 2), (12,)), (g[:2, :2].astype(np.float16), (6,)),
                     (r.standard_normal((5, 4)), (1, 4)), (r.standard_normal((5, 4)), (5, 1)), (r.standard_normal((0, 4)), (4,)),
                     (r.standard_normal((3, 4)), ())]:
        axes = tuple(range(g.ndim - len(shape))) + tuple(i + g.ndim - len(shape) for i, n in enumerate(shape) if n == 1)
        precise = g.dtype != np.float16                 # float16: NumPy's own sum, the path it takes
        want = np.sum(g.astype(np.float64) if precise else g, axis=axes).reshape(shape)
        got = P.unbroadcast(g, shape)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5 if precise else 0, atol=1e-4 if precise else 0)
        assert np.shape(got) == shape and np.result_type(got) == g.dtype

# ---------------------------------------------------------------------------------------------------- the step

def test_the_learners_cnn_step_matches_the_hand_written_one():
    "Both plain-NumPy forms of the suite's CNN step (one GEMM, an einsum) give the hand-written step's loss and gradients."
    from bench.workloads import cnn
    reference = cnn.hand_numpy({}).cases['step']()
    for contender in (cnn.fastad_traced, cnn.fastad_traced_einsum):
        loss, grads = contender({}).cases['step']()
        np.testing.assert_allclose(loss, reference[0], rtol=1e-5)
        for g, want in zip(grads, reference[1]):
            np.testing.assert_allclose(g, want, rtol=2e-3, atol=1e-4 * np.abs(want).max())
