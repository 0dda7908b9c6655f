"""The breadth of NumPy fastad differentiates (03a1 and the adapters of 03b1), against float64 central differences.

Each case checks the pullback at first order (`check_pullback`, as in test_primitives) and at second order: the
gradient of <v, f(x)> is itself differentiated and checked the same way. Shapes, broadcasting and axes are drawn
by hypothesis (derandomized, few examples), and everything runs on NumPy and on the strict backend.
"""
import warnings
import numpy as np, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from hypothesis.extra.numpy import mutually_broadcastable_shapes, valid_tuple_axes
import fastad as fd
from fastad.backend import to_device, to_host, np2, numpy_function, NUMPY_CROSSES_2_VECTORS, get_backend
from fastad.dispatch import supported_functions
from fastad.primitives import groups
from test_primitives import check_pullback

few = settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
seeds = st.integers(0, 2**31)

def check_second(f, *xs, seed=1, tol=1e-5, host_reference=True):
    "The gradient of <v, f(x)> with respect to each argument, checked by check_pullback: second derivatives."
    r = np.random.default_rng(seed)
    hosts = [np.asarray(x, np.float64) for x in xs]
    xs = [to_device(x) for x in hosts]
    v_host = r.standard_normal(np.shape(to_host(fd.value_with_pullback(f, *xs)[0])))
    v = to_device(v_host)
    for i in range(len(xs)):
        def grad_i(x, i=i):                          # under the NumPy backend, check_pullback's host reference
            vi, others = (v_host, hosts) if get_backend() == 'numpy' else (v, xs)
            return fd.gradient(lambda y: np.sum(vi * f(*others[:i], y, *others[i + 1:])), x)
        with warnings.catch_warnings():              # a piecewise-linear f has a constant gradient: no warning wanted
            warnings.simplefilter('ignore', fd.ZeroDerivativeWarning)
            check_pullback(grad_i, hosts[i], seed=seed, tol=tol, host_reference=host_reference)

def check_both(f, *xs, second=True):
    """First and second derivatives of `f`, a function of its arguments alone, against central differences of
    NumPy's own `f` on the host (under CuPy, which lacks some of the functions tested here, and the strict backend)."""
    check_pullback(f, *xs, host_reference=True)
    if second: check_second(f, *xs)

def rand(seed, shape, low=None, high=2.0):
    r = np.random.default_rng(seed)
    return r.uniform(low, high, shape) if low is not None else r.standard_normal(shape)

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
shapes1 = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)

# --- 1. elementwise ------------------------------------------------------------------------------------------
ANY = {'exp2': np.exp2, 'sinh': np.sinh, 'cosh': np.cosh, 'arctan': np.arctan, 'arcsinh': np.arcsinh, 'fabs': np.fabs,
       'sinc': np.sinc, 'deg2rad': np.deg2rad, 'radians': np.radians, 'rad2deg': np.rad2deg, 'degrees': np.degrees,
       'nan_to_num': np.nan_to_num}
POSITIVE = {'log2': np.log2, 'log10': np.log10, 'reciprocal': np.reciprocal, 'cbrt': np.cbrt,
            'arccosh': lambda x: np.arccosh(x + 1), 'arcsin': lambda x: np.arcsin(x / 2.5),
            'arccos': lambda x: np.arccos(x / 2.5), 'arctanh': lambda x: np.arctanh(x / 2.5)}

@pytest.mark.parametrize('name', list(ANY) + list(POSITIVE))
@given(shape=shapes, seed=seeds)
@few
def test_elementwise(any_backend, name, shape, seed):
    if name in ANY: check_both(ANY[name], rand(seed, shape))
    else: check_both(POSITIVE[name], rand(seed, shape, low=0.5))

BINARY = {'arctan2': np.arctan2, 'hypot': np.hypot, 'logaddexp': np.logaddexp, 'logaddexp2': np.logaddexp2,
          'fmax': np.fmax, 'fmin': np.fmin, 'float_power': np.float_power, 'fmod': np.fmod,
          'copysign': lambda x, y: np.copysign(x, y - 1.2)}

@pytest.mark.parametrize('name', BINARY)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3), seed=seeds)
@few
def test_binary_elementwise_broadcasting(any_backend, name, shapes, seed):
    sa, sb = shapes.input_shapes
    a, b = rand(seed, sa, low=0.5), rand(seed + 1, sb, low=0.5) + 0.01    # no ties, positive bases
    check_both(BINARY[name], a, b)

def test_piecewise_constant_functions_give_plain_results():
    x = np.array([-1.5, 0.3, 2.7])
    for f in (np.floor, np.ceil, np.round, np.rint, np.trunc, np.sign, np.fix, lambda x: np.heaviside(x, 0.5)):
        g = fd.gradient(lambda x: np.sum(f(x) * x), x)            # d(f(x) x) = f(x): f itself contributes nothing
        np.testing.assert_array_equal(g, f(x))

def test_fmax_ignores_nan():
    g = fd.gradient(lambda x, y: np.sum(np.fmax(x, y)), np.array([np.nan, 1.]), np.array([2., np.nan]))
    np.testing.assert_array_equal(g, ([0., 1.], [1., 0.]))

# --- 2. reductions and scans ---------------------------------------------------------------------------------
@pytest.mark.parametrize('reduce', [np.prod, np.nansum, np.nanmean, np.nanmax, np.nanmin, np.ptp, np.median,
                                    lambda x, **k: np.quantile(x, 0.3, **k), lambda x, **k: np.percentile(x, [20, 90], **k),
                                    lambda x, **k: np.average(x, **k), lambda x, **k: x.prod(**k)])
@given(data=st.data(), seed=seeds, keepdims=st.booleans())
@few
def test_reductions_on_random_shapes_and_axes(any_backend, reduce, data, seed, keepdims):
    shape = data.draw(shapes1)
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1) | valid_tuple_axes(len(shape), min_size=1))
    check_both(lambda x: reduce(x, axis=axis, keepdims=keepdims), rand(seed, shape, low=0.3))

@pytest.mark.parametrize('scan', [np.cumsum, np.cumprod, lambda x, axis: x.cumsum(axis)])
@given(shape=shapes1, seed=seeds, data=st.data())
@few
def test_scans(any_backend, scan, shape, seed, data):
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    check_both(lambda x: scan(x, axis=axis), rand(seed, shape, low=0.5))

def test_prod_and_cumprod_with_zeros(any_backend):
    x = rand(3, (3, 4, 2))
    x[0, 1, 0] = 0; x[1, :2, 1] = 0                               # one zero in some slices, two in another
    for axis in (None, 0, 1, 2):
        check_pullback(lambda x: np.prod(x, axis=axis), x)
        check_pullback(lambda x: np.cumprod(x, axis=axis), x)
    check_second(lambda x: np.prod(x, axis=2), x)                   # at most one zero per slice along axis 2

def test_nan_functions_skip_nan(any_backend):
    x = rand(4, (3, 4)); x[1, 2] = np.nan
    for f in (np.nansum, np.nanmean, np.nanmax, np.nanmin, np.nanprod):
        g = to_host(fd.gradient(lambda x: np.sum(f(x, axis=1)), to_device(x)))
        assert g[1, 2] == 0 and np.isfinite(g).all(), f
        check_pullback(lambda x: f(x, axis=0), x)

@pytest.mark.parametrize('case', ['trace', 'trace offset', 'diff', 'diff 2', 'diff prepend', 'average weights',
                                  'average returned', 'quantile methods', 'cumulative_sum'])
def test_more_reductions(any_backend, case):
    x, w = rand(5, (3, 4, 5)), rand(6, (4,), low=0.5)
    f = {'trace': lambda x: np.trace(x), 'trace offset': lambda x: np.trace(x, 1, 1, 2),
         'diff': lambda x: np.diff(x), 'diff 2': lambda x: np.diff(x, 2, axis=0),
         'diff prepend': lambda x: np.diff(x, axis=1, prepend=0.5, append=x[:, :1]),
         'average weights': lambda x: np.average(x, axis=1, weights=x[0, :, 0] ** 2 + 1),
         'average returned': lambda x: np.stack(np.average(x, axis=(0, 2), returned=True)),
         'quantile methods': lambda x: np.stack([np.quantile(x, 0.4, axis=2, method=m) for m in ('lower', 'higher', 'midpoint', 'nearest')]),
         'cumulative_sum': lambda x: np.cumulative_sum(x, axis=1, include_initial=True)}[case]
    if case == 'cumulative_sum' and np2.cumulative_sum is None: pytest.skip(f"NumPy {np.__version__} has no numpy.cumulative_sum")
    check_both(f, x)

NORMS = [(None, None), (2, 0), (1, -1), (np.inf, 1), (-np.inf, 0), (0.5, 1), (3, None), ('fro', (0, 1)), (1, (1, 0)),
         (-1, (0, 1)), (np.inf, (0, 1)), (-np.inf, (1, 0)), (None, (0, 1))]

@pytest.mark.parametrize('ord, axis', NORMS, ids=[f"{o}-{a}" for o, a in NORMS])
@pytest.mark.parametrize('keepdims', [False, True])
def test_norm(any_backend, ord, axis, keepdims):
    x = rand(7, (3, 4)) if axis is not None or ord in (None, 'fro') else rand(7, (5,))
    check_both(lambda x: np.linalg.norm(x, ord, axis, keepdims), x)

def test_norm_at_the_origin_has_gradient_zero(any_backend):
    for ord in (None, 2, 3):
        g = fd.gradient(lambda x: np.linalg.norm(x, ord), to_device(np.zeros(3)))
        np.testing.assert_array_equal(to_host(g), np.zeros(3))

# --- 3. products ---------------------------------------------------------------------------------------------
PRODUCTS = {
    'outer': (np.outer, (3,), (2, 2)), 'inner': (np.inner, (2, 3), (4, 3)), 'inner scalar': (np.inner, (), (3,)),
    'tensordot 2': (np.tensordot, (2, 3, 4), (3, 4, 2)), 'tensordot 1': (lambda a, b: np.tensordot(a, b, 1), (2, 3), (3, 4)),
    'tensordot 0': (lambda a, b: np.tensordot(a, b, 0), (2,), (3,)),
    'tensordot pairs': (lambda a, b: np.tensordot(a, b, ([0, 2], [2, 0])), (2, 3, 4), (4, 5, 2)),
    'tensordot ints': (lambda a, b: np.tensordot(a, b, (1, 0)), (2, 3), (3, 4)),
    'kron': (np.kron, (2, 3), (3, 2)), 'kron mixed': (np.kron, (3,), (2, 2)), 'cross': (np.cross, (4, 3), (3,)),
    'cross axis': (lambda a, b: np.cross(a, b, axis=0), (3, 4), (3, 4)), 'cross 2-3': (np.cross, (2,), (3,)),
    'dot 3-D': (np.dot, (2, 3, 4), (5, 4, 2)), 'dot 3-D vector': (np.dot, (2, 3, 4), (4,)), 'vdot': (np.vdot, (2, 3), (3, 2)),
    'einsum sublist': (lambda a, b: np.einsum(a, [0, 1], b, [1, 2], [0, 2]), (2, 3), (3, 4)),
    'einsum sublist ...': (lambda a, b: np.einsum(a, [Ellipsis, 1], b, [1]), (2, 3), (3,)),
    'einsum diagonal': (lambda a, b: np.einsum('iij,j->i', a, b), (3, 3, 2), (2,)),
    'einsum trace': (lambda a, b: np.einsum('ii', a) * b, (3, 3), (2,)),
    'einsum ii,jj': (lambda a, b: np.einsum('iji,jj->ij', a, b), (3, 2, 3), (2, 2)),
    'multi_dot': (lambda a, b: np.linalg.multi_dot([a, b, a, b[:, 0]]), (2, 3), (3, 2)),
    'linalg.vecdot': (np2.linalg.vecdot, (2, 3), (3,)),
}

@pytest.mark.parametrize('name', PRODUCTS)
def test_products(any_backend, name):
    f, sa, sb = PRODUCTS[name]
    if f is None: pytest.skip(f"NumPy {np.__version__} has no numpy.{name}")
    if name == 'cross 2-3' and not NUMPY_CROSSES_2_VECTORS: pytest.skip("NumPy 2.5 refuses 2-vectors in np.cross (test_numpy_versions)")
    check_both(f, rand(8, sa), rand(9, sb))

@pytest.mark.parametrize('name', ['outer', 'inner', 'tensordot 2', 'kron', 'cross', 'dot 3-D', 'vdot', 'einsum diagonal'])
def test_products_match_numpy(name):
    f, sa, sb = PRODUCTS[name]
    a, b = rand(10, sa), rand(11, sb)
    value, _ = fd.value_with_pullback(f, a, b)
    np.testing.assert_allclose(value, f(a, b), rtol=1e-12)

# --- 5. shape and indexing -----------------------------------------------------------------------------------
SHAPES = {
    'repeat': lambda x: np.repeat(x, 2, axis=1), 'repeat list': lambda x: np.repeat(x, [1, 0, 3], axis=1),
    'repeat flat': lambda x: np.repeat(x, 2), 'tile': lambda x: np.tile(x, (2, 1, 3)), 'tile int': lambda x: np.tile(x, 2),
    'tile long': lambda x: np.tile(x, (2, 1, 1, 2)),
    'pad constant': lambda x: np.pad(x, ((1, 0), (0, 2), (1, 1)), constant_values=2.0), 'pad edge': lambda x: np.pad(x, 2, mode='edge'),
    'pad reflect': lambda x: np.pad(x, ((1, 2), (2, 1), (0, 1)), mode='reflect'), 'pad symmetric': lambda x: np.pad(x, 1, mode='symmetric'),
    'pad wrap': lambda x: np.pad(x, ((0, 5), (1, 1), (2, 0)), mode='wrap'),
    'roll': lambda x: np.roll(x, 2, axis=1), 'roll flat': lambda x: np.roll(x, -3), 'roll many': lambda x: np.roll(x, (1, 2), axis=(0, 2)),
    'flip': lambda x: np.flip(x, (0, 2)), 'flip all': np.flip, 'flipud': np.flipud, 'fliplr': np.fliplr,
    'rot90': np.rot90, 'rot90 2': lambda x: np.rot90(x, 2, axes=(1, 2)), 'rot90 3': lambda x: np.rot90(x, -1, axes=(2, 0)),
    'moveaxis': lambda x: np.moveaxis(x, 0, -1), 'moveaxis many': lambda x: np.moveaxis(x, (0, 1), (2, 0)),
    'rollaxis': lambda x: np.rollaxis(x, 2), 'rollaxis start': lambda x: np.rollaxis(x, 0, 2),
    'diag 2-D': lambda x: np.diag(x[0], 1), 'diag 1-D': lambda x: np.diag(x[0, 0], -2), 'diagflat': lambda x: np.diagflat(x[0, :2]),
    'diagonal': lambda x: np.diagonal(x, 1, 2, 0), 'diagonal method': lambda x: x.diagonal(-1, 1, 2),
    'triu': lambda x: np.triu(x, -1), 'tril': lambda x: np.tril(x, 1),
    'atleast_1d': lambda x: np.atleast_1d(x[0, 0, 0]), 'atleast_2d': lambda x: np.atleast_2d(x[0, 0]),
    'atleast_3d': lambda x: np.concatenate([np.atleast_3d(x[0, 0]).ravel(), np.atleast_3d(x[0]).ravel()]),
    'take': lambda x: np.take(x, [0, 2, 2], axis=1), 'take flat': lambda x: np.take(x, [[5, 0], [5, 7]]),
    'take wrap': lambda x: np.take(x, [4, -1], axis=2, mode='wrap'), 'take clip': lambda x: np.take(x, [7, 0], axis=1, mode='clip'),
    'take method': lambda x: x.take([1, 1], axis=0),
    'take_along_axis': lambda x: np.take_along_axis(x, np.argsort(x, axis=1), axis=1),
    'take_along_axis bcast': lambda x: np.take_along_axis(x, np.argmax(x, axis=2, keepdims=True), axis=2),
    'compress': lambda x: np.compress([True, False, True], x, axis=1), 'compress flat': lambda x: np.compress([0, 1, 1], x),
    'select': lambda x: np.select([x > 0.5, x < -0.5], [x * 2, x ** 2], default=-x),
    'sort': lambda x: np.sort(x), 'sort 0': lambda x: np.sort(x, 0), 'sort flat': lambda x: np.sort(x, axis=None),
    'partition': lambda x: np.partition(x, 1, axis=1),
    'windows': lambda x: np.lib.stride_tricks.sliding_window_view(x, (2, 3), axis=(1, 2)),
    'windows all': lambda x: np.lib.stride_tricks.sliding_window_view(x, (2, 2, 3)),
    'windows one': lambda x: np.lib.stride_tricks.sliding_window_view(x, 2, axis=-1),
    'put_along_axis': lambda x: fd.put_along_axis(x, np.array([[[0], [2]]] * 2).repeat(4, 2), x[:, :2] ** 2, axis=1),
    'put repeated': lambda x: fd.put_along_axis(x, np.array([[[1], [1]]] * 2).repeat(4, 2), x[:, :2] * 3, axis=1),
}

@pytest.mark.parametrize('name', SHAPES)
def test_shape_and_indexing(any_backend, name):
    x = rand(12, (2, 3, 4))
    f = SHAPES[name]
    if name.startswith('put'):
        xp = np if any_backend is np else any_backend
        f = lambda x, f=f: f(x) if xp is np else pytest.skip("indices built on the host here")
    check_both(f, x)

@given(shape=shapes1, seed=seeds, data=st.data())
@few
def test_windows_on_random_shapes(any_backend, shape, seed, data):
    axes = data.draw(st.permutations(range(len(shape))).map(lambda p: p[:len(p) // 2 + 1]))
    window = tuple(data.draw(st.integers(1, shape[a])) for a in axes)
    check_both(lambda x: np.lib.stride_tricks.sliding_window_view(x, window, axis=axes), rand(seed, shape))

def test_sliding_windows_pullback_scatters_back():
    g = fd.pullback(lambda x: np.lib.stride_tricks.sliding_window_view(x, 3), np.zeros(5))(np.ones((3, 3)))
    np.testing.assert_array_equal(g, [1., 2., 3., 2., 1.])

def test_put_along_axis_keeps_the_last_write(any_backend):
    "As NumPy's scatter does; CuPy's keeps any one of repeated writes, so fastad picks the last itself there."
    x, at = to_device(np.zeros((2, 3))), to_device(np.array([[1, 1, 0, 1], [2, 0, 2, 2]]))
    value, pb = fd.value_with_pullback(lambda v: fd.put_along_axis(x, at, v, axis=1), to_device(np.array([[5., 7., 1., 9.], [2., 3., 4., 6.]])))
    np.testing.assert_array_equal(to_host(value), [[1., 9., 0.], [3., 0., 6.]])
    np.testing.assert_array_equal(to_host(pb(to_device(np.ones((2, 3))))), [[0., 0., 1., 1.], [0., 1., 0., 1.]])   # overwritten: no slope
    value = fd.value_with_pullback(lambda v: fd.put_along_axis(x, at[:1, :2], v, axis=1), to_device(np.array([[5.], [8.]])))[0]
    np.testing.assert_array_equal(to_host(value), [[0., 5., 0.], [0., 8., 0.]])      # indices and values broadcast along axis 0
    value = fd.value_with_pullback(lambda x: fd.put_along_axis(x, at, 2.5, axis=1), x)[0]  # a Python number as the values
    np.testing.assert_array_equal(to_host(value), [[2.5, 2.5, 0.], [2.5, 0., 2.5]])

def test_along_axis_refuses_an_axis_or_indices_that_do_not_fit():
    "An axis out of range would otherwise wrap around (axis 5 of a 2-d array read as axis 1)."
    x, at = np.ones((2, 3)), np.array([[0], [1]])
    with pytest.raises(fd.ShapeError, match="numpy.take_along_axis: axis 5 is out of range for an array of 2 dimensions"):
        fd.gradient(lambda x: np.take_along_axis(x, at, axis=5).sum(), x)
    with pytest.raises(fd.ShapeError, match="fastad.put_along_axis: axis -3 is out of range"):
        fd.gradient(lambda x: fd.put_along_axis(x, at, 1.0, axis=-3).sum(), x)
    with pytest.raises(fd.ShapeError, match=r"fastad.put_along_axis: `indices` must have as many dimensions as the array \(2\), not 1"):
        fd.gradient(lambda x: fd.put_along_axis(x, at[:, 0], 1.0, axis=1).sum(), x)

# --- 6. joining and splitting --------------------------------------------------------------------------------
JOINS = {
    'vstack': lambda a, b: np.vstack([a, b[:, 0]]), 'hstack': lambda a, b: np.hstack([a, b.T]), 'hstack 1-D': lambda a, b: np.hstack([a[0], b[:, 0]]),
    'dstack': lambda a, b: np.dstack([a, b.T]), 'column_stack': lambda a, b: np.column_stack([a[0], b, b[:, 1]]),
    'append': lambda a, b: np.append(a, b), 'append axis': lambda a, b: np.append(a, b.T, axis=1),
    'block': lambda a, b: np.block([[a, b.T], [a[:1], b.T[:1]]]), 'block 1-D': lambda a, b: np.block([a[0], b[0], 1.0]),
    'split': lambda a, b: np.concatenate([p * i for i, p in enumerate(np.split(a, [1, 3], axis=1), 1)], axis=1),
    'split sections': lambda a, b: np.stack(np.split(b, 2, axis=1)), 'array_split': lambda a, b: np.concatenate([p * i for i, p in enumerate(np.array_split(a, 3, axis=1), 1)], axis=1),
    'hsplit': lambda a, b: np.stack(np.hsplit(a, 2)), 'vsplit': lambda a, b: np.stack(np.vsplit(b, 2)),
    'dsplit': lambda a, b: np.concatenate(np.dsplit(a[..., None] * b[0, :1], 1)), 'unstack': lambda a, b: np.stack(np.unstack(a + b.T, axis=1)[::-1]),   # both traced: CuPy has no np.unstack of its own
}

@pytest.mark.parametrize('name', JOINS)
def test_joining_and_splitting(any_backend, name):
    if name == 'unstack' and np2.unstack is None: pytest.skip(f"NumPy {np.__version__} has no numpy.unstack")
    check_both(JOINS[name], rand(13, (2, 4)), rand(14, (4, 2)))

@pytest.mark.skipif(numpy_function('row_stack') is None, reason="NumPy 2.5 removed numpy.row_stack")
def test_row_stack_goes_through_vstack():
    with pytest.warns(DeprecationWarning):
        g = fd.gradient(lambda x: np.sum(np.row_stack([x, 2 * x])), np.ones(2))
    np.testing.assert_array_equal(g, [3., 3.])

# --- 7. building arrays --------------------------------------------------------------------------------------
def test_linspace_and_full_like(any_backend):
    check_both(lambda a, b: np.linspace(a, b, 5), rand(15, (3,)), rand(16, (3,)))
    check_both(lambda a, b: np.linspace(a, b[0], 4, endpoint=False, axis=1), rand(15, (2, 3)), rand(16, (3,)))
    check_both(lambda a: np.logspace(a, 1.0, 3, base=2.0), rand(17, (2,)))
    check_both(lambda a: np.full_like(a, a[0] * 2), rand(18, (3,)))
    value = fd.value_with_pullback(lambda a: np.linspace(a, 2.0, 5), 1.0)[0]
    np.testing.assert_allclose(value, np.linspace(1.0, 2.0, 5), rtol=1e-15)

def test_building_arrays_refuses_clearly():
    t = fd.engine.Recording(); x = t.new_input(np.ones(2))
    with pytest.raises(fd.DifferentiationError, match="in place"): np.copyto(np.zeros(2), x)
    with pytest.raises(fd.DifferentiationError, match="in place"): np.put_along_axis(x, np.array([0]), 1.0, 0)
    with pytest.raises(fd.DifferentiationError, match="np.sort"): x.sort()
    with pytest.raises(fd.DifferentiationError, match=r"cannot become a plain NumPy array.*np\.stack\(\[x, y\]\)"):
        np.array([x, x])                                   # NumPy gives no hook for this: the message says what to use
    with pytest.raises(fd.DifferentiationError, match=r"np\.stack"): np.mean([x, x])
    t.active = False

# --- 8. method forms -----------------------------------------------------------------------------------------
METHODS = {'prod': lambda x: x.prod(axis=1), 'cumsum': lambda x: x.cumsum(), 'cumprod': lambda x: x.cumprod(1),
           'repeat': lambda x: x.repeat(2, axis=0), 'diagonal': lambda x: x.diagonal(), 'take': lambda x: x.take([2, 0]),
           'compress': lambda x: x.compress([1, 0, 1], axis=1), 'conj': lambda x: x.conj() * x, 'flatten': lambda x: x.flatten()}

@pytest.mark.parametrize('name', METHODS)
def test_method_forms(any_backend, name):
    if not hasattr(to_device(np.ones(1)), name): pytest.skip(f"this backend's arrays have no .{name}() to compare with")
    check_both(METHODS[name], rand(19, (3, 3), low=0.5))

# --- refusals and the table ----------------------------------------------------------------------------------
@pytest.mark.parametrize('call, message', [
    (lambda x: np.pad(x, 1, mode='linear_ramp'), "mode='linear_ramp'"), (lambda x: np.quantile(x, 0.5, method='weibull'), "weibull"),
    (lambda x: np.take(x, x), "numpy.take: `indices` cannot be differentiated"),
    (lambda x: np.repeat(x, x), "numpy.repeat: `repeats` cannot"),
    (lambda x: np.lib.stride_tricks.sliding_window_view(x, (1, 1), axis=(0, 0)), "repeated along one axis"),
])
def test_refusals_name_the_function_and_argument(call, message):
    with pytest.raises(fd.FastADError, match=message.replace('(', r'\(').replace('.', r'\.')):
        fd.gradient(lambda x: np.sum(call(x)), np.ones(3))

def test_the_table_is_read_from_the_registry():
    table = supported_functions()
    assert 'other' not in table, table.get('other')          # every registered NumPy callable belongs to a group
    names = {n for ns in table.values() for n in ns}
    for f in ('numpy.cumsum', 'numpy.linalg.norm', 'numpy.lib.stride_tricks.sliding_window_view', 'numpy.hstack', 'x.prod'):
        assert f in names, f
    assert 'numpy.put_along_axis' not in names and 'x.sort' not in names   # refused, so not listed
    grouped = {f for fs in groups().values() for f in fs}     # each rule names its group: none is left out
    from fastad.primitives import REGISTRY
    assert {f for f, row in REGISTRY.items() if isinstance(f, np.ufunc) and row.primitive} <= grouped

def test_fmod_of_python_floats_by_zero_is_numpys_nan():
    "fmod's slope in y, -trunc(x / y), divided two Python floats: at y = 0.0 a ZeroDivisionError, where NumPy gives inf."
    f = lambda x, y: np.fmod(x, y)
    with np.errstate(all='ignore'):
        got = fd.value_with_gradient(f, 1.0, 0.0, argnums=(0, 1))
        want = fd.value_with_gradient(f, np.float64(1.0), np.float64(0.0), argnums=(0, 1))
        np.testing.assert_equal(got[0], np.fmod(1.0, 0.0))
    np.testing.assert_equal(got, want)
    np.testing.assert_equal(want[1], (1.0, -np.inf))
    from fastad.testing import numerical_gradient                 # beside the edge, the usual path
    np.testing.assert_allclose(fd.gradient(f, 7.0, 3.0, argnums=(0, 1)), numerical_gradient(f, 7.0, 3.0))


def test_supported_functions_reads_each_rows_group_and_the_traced_methods():
    "The table's groups are the registry rows' own (no separate list), its method forms Traced's own members."
    from fastad import dispatch
    from fastad.engine import Traced
    table = fd.supported_functions()
    assert 'other' not in table and set(groups()) <= set(table)
    for f, row in fd.primitives.REGISTRY.items():
        name = dispatch._public_name(f)
        if name.startswith('numpy') and not (row.refused and row.custom is None):
            assert name in table[row.group], (name, row.group)
    assert 'numpy.linalg.trace' not in table['products'] and 'numpy.unique' in table['shape and indexing']
    forms = table['method forms']
    assert {'x.sum', 'x.T', 'x.astype', 'x.copy'} <= set(forms)
    assert not {'x.sort', 'x.fill', 'x.round', 'x.shape', 'x.dtype'} & set(forms)   # refused, or a plain result
    assert all(hasattr(Traced, f[2:]) for f in forms)
