"""Every primitive, through the public transforms, against central differences in float64 on random shapes.

For a function f and a random cotangent v, the pullback must return J^T v; its dot product with a random
direction d must equal the directional derivative of <v, f(x)> along d, which central differences
estimate to ~1e-9. Each case also runs under the strict backend (no silent host copies) via `any_backend`.
And the edges: masks that select, no silent derivative drops, logsumexp at infinities, complex intermediates refused,
std/var/relu at their edges, one convention for ties, and fastad errors instead of raw ones.
"""
import contextlib, warnings
import numpy as np, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from hypothesis.extra.numpy import mutually_broadcastable_shapes, valid_tuple_axes
import fastad as fd
from fastad.backend import to_device, to_host, array_module, get_backend, use_backend
from fastad.strict import StrictArray
from fastad.testing import numerical_gradient
from fastad import primitives as P, engine as E, dispatch as D
from fastad.errors import FastADError, ShapeError
from fastad.transforms import ZeroDerivativeWarning
from fastad.errors import DifferentiationError

def check_pullback(f, *xs, eps=1e-6, tol=1e-6, seed=0, host_reference=False):
    """Assert fd.pullback(f, *xs) agrees with central differences, and gradients keep shapes and array types.
    `host_reference`: the value and the differences are those of `f` on NumPy arrays, on the host (under the NumPy
    backend), when the active backend is CuPy or the strict one that stands in for it: fastad on the device is
    checked against NumPy itself, which also serves the NumPy functions CuPy lacks (`np.block`, `take(mode=)`)."""
    rng = np.random.default_rng(seed)
    hosts = [np.asarray(x, np.float64) for x in xs]
    xs = [to_device(x) for x in hosts]
    value, pb = fd.value_with_pullback(f, *xs)
    v_host = rng.standard_normal(np.shape(to_host(value)))
    v = to_device(v_host)
    grads = pb(v)
    grads = grads if len(xs) > 1 else (grads,)
    on_host = host_reference and get_backend() != 'numpy'
    plain, v_plain = (hosts, v_host) if on_host else (xs, v)
    if on_host:                                          # the value on the device, against NumPy's
        with use_backend('numpy'): expected = f(*hosts)
        np.testing.assert_allclose(np.asarray(to_host(value)), np.asarray(expected), rtol=1e-12, atol=1e-12)
    for i, (x, g) in enumerate(zip(xs, grads)):
        assert g.shape == x.shape and g.dtype == np.float64, (i, g.shape, x.shape)
        assert array_module(g) is array_module(x), f"gradient {i} changed device"
        if type(x) is StrictArray: assert type(g) is StrictArray, (i, type(g))
        d_host = rng.standard_normal(x.shape)
        d = d_host if on_host else to_device(d_host)
        def directional(t):
            with use_backend('numpy') if on_host else contextlib.nullcontext():
                return float(to_host(np.sum(v_plain * f(*plain[:i], plain[i] + t * d, *plain[i+1:]))))
        numeric = (directional(eps) - directional(-eps)) / (2 * eps)
        analytic = float(np.sum(to_host(g) * d_host))
        assert abs(analytic - numeric) <= tol * max(1.0, abs(numeric)), (f, i, analytic, numeric)

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
seeds = st.integers(0, 2**31)
fast = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

def rand(seed, shape, low=None):
    r = np.random.default_rng(seed)
    return r.uniform(low, 2.0, shape) if low is not None else r.standard_normal(shape)

UNARY = {'exp': np.exp, 'sin': np.sin, 'cos': np.cos, 'tan': lambda x: np.tan(x * 0.5), 'tanh': np.tanh,
         'abs': np.abs, 'square': np.square, 'expm1': np.expm1, 'neg': lambda x: -x, 'pos': lambda x: +x,
         'relu': fd.relu, 'x**3': lambda x: x ** 3, '2**x': lambda x: 2.0 ** x, 'x*x': lambda x: x * x}
POSITIVE = {'log': np.log, 'sqrt': np.sqrt, 'log1p': np.log1p, 'x**0.5': lambda x: x ** 0.5, '1/x': lambda x: 1 / x}

@pytest.mark.parametrize('name', UNARY)
@given(shape=shapes, seed=seeds)
@fast
def test_unary(any_backend, name, shape, seed):
    check_pullback(UNARY[name], rand(seed, shape))

@pytest.mark.parametrize('name', POSITIVE)
@given(shape=shapes, seed=seeds)
@fast
def test_unary_positive_domain(any_backend, name, shape, seed):
    check_pullback(POSITIVE[name], rand(seed, shape, low=0.5))

BINARY = {'%': lambda a, b: a % b, '+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b, '/': lambda a, b: a / b,
          '**': lambda a, b: a ** b, 'maximum': np.maximum, 'minimum': np.minimum,
          'np.add': np.add, 'np.multiply': np.multiply, 'np.subtract': np.subtract, 'np.true_divide': np.true_divide}
BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (4,)), ((2, 3, 4), (3, 1)), ((), (2, 3)), ((4, 1), (1, 5))]

@pytest.mark.parametrize('name', BINARY)
@pytest.mark.parametrize('sa, sb', BROADCAST_PAIRS)
def test_binary_with_broadcasting(any_backend, name, sa, sb):
    r = np.random.default_rng(len(name) * 7 + len(sa))
    a, b = r.uniform(0.5, 2.0, sa), r.uniform(0.5, 2.0, sb) + (0.01 if name in ('maximum', 'minimum') else 0)
    check_pullback(BINARY[name], a, b)             # positive and distinct: no ties, no log of negatives
    check_pullback(BINARY[name], b, a)

@pytest.mark.parametrize('name', ['+', '-', '*', '/', '**', 'maximum', 'minimum'])
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3), seed=seeds)
@fast
def test_binary_on_random_broadcast_shapes(any_backend, name, shapes, seed):
    sa, sb = shapes.input_shapes
    a, b = rand(seed, sa, low=0.5), rand(seed + 1, sb, low=0.5)
    check_pullback(BINARY[name], a, b)

@pytest.mark.parametrize('reduce', [np.sum, np.mean, np.max, np.min])
@given(data=st.data(), seed=seeds, keepdims=st.booleans())
@fast
def test_reductions_on_random_shapes_and_axes(any_backend, reduce, data, seed, keepdims):
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1) | valid_tuple_axes(len(shape)))
    check_pullback(lambda x: reduce(x, axis=axis, keepdims=keepdims), rand(seed, shape))

MATMUL = [((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)), ((5, 3, 4), (4, 2)), ((3, 4), (5, 4, 2)),
          ((5, 3, 4), (5, 4, 2)), ((4,), (5, 4, 2)), ((5, 3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2))]

@pytest.mark.parametrize('sa, sb', MATMUL)
def test_matmul(any_backend, sa, sb):
    r = np.random.default_rng(1)
    check_pullback(lambda a, b: a @ b, r.standard_normal(sa), r.standard_normal(sb))
    check_pullback(np.matmul, r.standard_normal(sa), r.standard_normal(sb))

def test_dot(any_backend):
    r = np.random.default_rng(2)
    for sa, sb in [((3, 4), (4, 2)), ((4,), (4,)), ((3, 4), (4,)), ((), (3,))]:
        check_pullback(np.dot, r.standard_normal(sa), r.standard_normal(sb))
        check_pullback(lambda a, b: a.dot(b) if np.ndim(a) else a * b, r.standard_normal(sa), r.standard_normal(sb))

AXES = [None, 0, -1, (0, 2), (1,)]

@pytest.mark.parametrize('reduce', [np.sum, np.mean, np.max, np.min, lambda x, **k: x.sum(**k), lambda x, **k: x.mean(**k),
                                    lambda x, **k: x.max(**k), lambda x, **k: np.add.reduce(x, **k) if k.get('axis') is not None else np.sum(x, **k)])
@pytest.mark.parametrize('axis', AXES)
@pytest.mark.parametrize('keepdims', [False, True])
def test_reductions(any_backend, reduce, axis, keepdims):
    check_pullback(lambda x: reduce(x, axis=axis, keepdims=keepdims), np.random.default_rng(3).standard_normal((3, 4, 5)))

def test_var_std(any_backend):
    x = np.random.default_rng(4).standard_normal((4, 5))
    for f in (lambda x: x.var(), lambda x: x.std(axis=0), lambda x: x.var(axis=1, keepdims=True), lambda x: x.std(ddof=1)):
        check_pullback(f, x)

SHAPE_OPS = {
    'reshape': lambda x: x.reshape(6, 4), 'np.reshape': lambda x: np.reshape(x, (-1,)), 'reshape*': lambda x: x.reshape(4, -1, 2),
    'T': lambda x: x.T, 'transpose': lambda x: x.transpose(1, 2, 0), 'np.transpose': lambda x: np.transpose(x, (2, 0, 1)),
    'swapaxes': lambda x: x.swapaxes(0, 2), 'squeeze': lambda x: x[:, :1].squeeze(1), 'np.squeeze': lambda x: np.squeeze(x[None]),
    'expand_dims': lambda x: np.expand_dims(x, 1), 'ravel': lambda x: x.ravel(), 'flatten': lambda x: x.flatten(),
    'broadcast_to': lambda x: np.broadcast_to(x[:, :1], (5, 2, 3, 4)), 'mT': lambda x: x.mT,
    'int': lambda x: x[1], 'slice': lambda x: x[:, 1:3], 'step': lambda x: x[::-1, ::2], 'ellipsis/None': lambda x: x[..., None, 1],
    'int array': lambda x: x[[0, 0, 1]], 'mask': lambda x: x[x > 0], 'mixed': lambda x: x[[1, 0], :, 2],
    'iterate': lambda x: sum(row for row in x), 'concatenate': lambda x: np.concatenate([x, 2 * x, x[:1]], axis=0),
    'concatenate -1': lambda x: np.concatenate([x, x * x], axis=-1), 'stack': lambda x: np.stack([x, x * 3], axis=1),
    'stack -1': lambda x: np.stack([x, x], axis=-1), 'clip': lambda x: np.clip(x, -0.5, 0.5), 'clip method': lambda x: x.clip(max=0.3),
    'where': lambda x: np.where(x > 0, x, 0.1 * x), 'mask replace': lambda x: np.where(x < 0, 0.0, x), 'astype': lambda x: x.astype(np.float64),
    'logsumexp': lambda x: fd.logsumexp(x), 'logsumexp 0': lambda x: fd.logsumexp(x, axis=0, keepdims=True),
    'log_softmax': lambda x: fd.log_softmax(x), 'log_softmax 1': lambda x: fd.log_softmax(x, axis=1),
}

@pytest.mark.parametrize('name', SHAPE_OPS)
def test_shape_indexing_and_friends(any_backend, name):
    x = np.random.default_rng(5).standard_normal((2, 3, 4))
    check_pullback(SHAPE_OPS[name], x)

def test_where_both_branches_traced(any_backend):
    r = np.random.default_rng(6)
    check_pullback(lambda a, b: np.where(a > b, a * b, b - a), r.standard_normal((3, 4)), r.standard_normal(4))

def test_logsumexp_is_stable():
    g = fd.gradient(lambda x: fd.logsumexp(x), np.array([1000., 1000., -1000.]))
    np.testing.assert_allclose(g, [0.5, 0.5, 0.0])

@pytest.mark.parametrize('f, d2', [(np.sin, lambda x: -np.sin(x)), (np.exp, np.exp), (np.tanh, lambda x: -2 * np.tanh(x) / np.cosh(x) ** 2),
                                    (lambda x: x ** 3, lambda x: 6 * x), (np.log, lambda x: -1 / x ** 2), (np.sqrt, lambda x: -0.25 * x ** -1.5)])
@given(x=st.floats(0.3, 2.5))
@settings(max_examples=10, deadline=None)
def test_second_derivatives(f, d2, x):
    assert abs(fd.gradient(fd.gradient(f))(x) - d2(x)) < 1e-9 * max(1, abs(d2(x)))

SECOND = {'sin': (np.sin, lambda x: -np.sin(x)), 'tanh': (np.tanh, lambda x: -2 * np.tanh(x) / np.cosh(x) ** 2),
          'exp': (np.exp, np.exp), 'x**3': (lambda x: x ** 3, lambda x: 6 * x), 'log': (np.log, lambda x: -1 / x ** 2)}

@pytest.mark.parametrize('name', SECOND)
def test_second_derivatives_of_arrays(any_backend, name):
    f, d2 = SECOND[name]                       # for elementwise f, the gradient of sum(f'(x)) is f''(x)
    x = np.random.default_rng(7).uniform(0.3, 2.5, (3, 4))
    g2 = fd.gradient(lambda x: fd.gradient(lambda y: f(y).sum(), x).sum(), to_device(x))
    assert type(g2) is type(to_device(x)) and g2.dtype == np.float64
    np.testing.assert_allclose(to_host(g2), d2(x), rtol=1e-9)

EINSUM = [('ik,kj->ij', (3, 4), (4, 2)), ('i,i->', (4,), (4,)), ('i,j->ij', (3,), (2,)), ('bij,bjk->bik', (2, 3, 4), (2, 4, 5)),
          ('ij->ji', (3, 4)), ('ij->', (3, 4)), ('ij,j', (3, 4), (4,)), ('ba,c', (2, 3), (4,)), ('...ij,...jk->...ik', (2, 3, 4), (4, 5)),
          ('...i,...i->...', (2, 3), (3,)), ('ij,jk,kl->il', (2, 3), (3, 4), (4, 2)), ('ij,kj->i', (3, 4), (2, 4)),
          ('ij,ij->ij', (1, 4), (3, 4)), ('i, j -> j', (3,), (2,)), ('ij,ij->j', (1, 3), (2, 3)), ('i,i->', (1,), (3,))]

@pytest.mark.parametrize('spec', EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(any_backend, spec):
    subscripts, *shapes = spec
    r = np.random.default_rng(8)
    check_pullback(lambda *xs: np.einsum(subscripts, *xs), *(r.standard_normal(s) for s in shapes))

def test_einsum_with_a_constant_operand_and_second_derivative(any_backend):
    a, x = (np.random.default_rng(9).standard_normal(s) for s in [(3, 3), (3,)])
    check_pullback(lambda x: np.einsum('ij,j->i', to_device(a), x), x)
    a, x = to_device(a), to_device(x)
    h = fd.gradient(lambda x: fd.gradient(lambda y: np.einsum('i,ij,j->', y, a, y), x).sum(), x)   # d/dx sum((a + a.T) x)
    np.testing.assert_allclose(to_host(h), to_host((a + a.T).sum(0)), rtol=1e-12)

# --- a Python float at the edges of its arithmetic: NumPy's inf and NaN, not Python's errors ---------------------
PYTHON_EDGES = {   # f, where Python's arithmetic raises (ZeroDivisionError, OverflowError), a point nearby
    'sin(x) / x at 0': (lambda x: np.sin(x) / x, 0.0, 0.3),
    'exp(x) ** 2 at 400': (lambda x: np.exp(x) ** 2, 400.0, 300.0),
    '1 / log(x) at 1': (lambda x: 1 / np.log(x), 1.0, 1.5),
    'x / 0': (lambda x: x / 0, 2.0, None),
    'x ** -1 at 0': (lambda x: x ** -1, 0.0, 0.5),
    '0.0 ** x at -1': (lambda x: 0.0 ** x, -1.0, None),
    '10.0 ** x at 400': (lambda x: 10.0 ** x, 400.0, 300.0),
}

@pytest.mark.parametrize('name', PYTHON_EDGES)
def test_a_python_float_follows_numpys_arithmetic_at_its_edges(name):
    """sin, cos, exp and log of a Python float are Python floats (math's, for speed): the operation after them must
    still give NumPy's inf or NaN, value and gradient, as on np.float64, with at most NumPy's warnings."""
    from fastad.testing import numerical_gradient
    f, x, near = PYTHON_EDGES[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with np.errstate(all='warn'):
            value, g = fd.value_with_gradient(f, x)
            value64, g64 = fd.value_with_gradient(f, np.float64(x))
            plain = f(np.float64(x))
    assert all(issubclass(w.category, RuntimeWarning) for w in caught), [str(w.message) for w in caught]
    assert type(value) is np.float64 and type(g) is float
    np.testing.assert_equal((value, g), (plain, g64))
    np.testing.assert_equal(value64, plain)
    if near is not None:                              # and the usual path, beside the edge, as central differences
        np.testing.assert_allclose(fd.gradient(f, near), numerical_gradient(f, near), rtol=1e-6)

def test_logsumexp_over_an_empty_axis_is_minus_inf():
    "An empty sum is 0 and its log -inf (SciPy's and JAX's logsumexp), with an empty gradient; log_softmax is empty."
    for shape, axis in [((0,), -1), ((2, 0), -1), ((2, 0), 1), ((0, 3), 0), ((0, 3), 1)]:
        x = np.zeros(shape)
        with np.errstate(divide='ignore'): plain = np.log(np.sum(np.exp(x), axis=axis))
        np.testing.assert_equal(fd.logsumexp(x, axis=axis), plain)
        value, g = fd.value_with_gradient(lambda x: fd.logsumexp(x, axis=axis).sum(), x)
        np.testing.assert_equal((value, g), (plain.sum(), np.zeros(shape)))
        assert fd.log_softmax(x, axis=axis).shape == shape


# ---- masks select, no silent drops, logsumexp at infinities, fastad errors instead of raw ones ---------------------
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

def numeric(f, x): return numerical_gradient(f, np.asarray(x, dtype=float))

def test_bincount_weights_a_small_example():
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


# --- std, var and relu at the edges ------------------------------------------------------------------------------------
ONE_ELEMENT = {'scalar': (lambda: 2.0, None), 'array of one': (lambda: np.array([2.0]), None),
               'axis of length 1': (lambda: np.array([[1.0], [3.0]]), 1), 'batch of one': (lambda: np.array([[1.0, 3.0]]), 0)}

@pytest.mark.parametrize('case', ONE_ELEMENT)
@pytest.mark.parametrize('how', ['np.var', 'x.var'])
def test_var_of_one_element_has_zero_gradient(how, case):
    make, axis = ONE_ELEMENT[case]
    f = (lambda x: np.sum(np.var(x, axis=axis))) if how == 'np.var' else (lambda x: np.sum(x.var(axis=axis)))
    close(fd.gradient(f, make()), np.zeros(np.shape(make())))

@pytest.mark.parametrize('case', ONE_ELEMENT)
@pytest.mark.parametrize('how', ['np.std', 'x.std'])
def test_std_of_one_element_has_zero_gradient(how, case):
    make, axis = ONE_ELEMENT[case]
    f = (lambda x: np.sum(np.std(x, axis=axis))) if how == 'np.std' else (lambda x: np.sum(x.std(axis=axis)))
    close(fd.gradient(f, make()), np.zeros(np.shape(make())))

def test_relu_of_minus_infinity():
    x = np.array([-np.inf, -1.0, 2.0, np.inf])
    assert fd.relu(x).tolist() == [0.0, 0.0, 2.0, np.inf]
    value, g = fd.value_with_gradient(lambda x: fd.relu(x)[:3].sum(), x)
    assert value == 2.0 and g.tolist() == [0.0, 0.0, 1.0, 0.0]

# --- errors that should not happen ---------------------------------------------------------------------------------
W = np.arange(1.0, 7.0).reshape(2, 3)
INT_AXIS = {   # name: (function of x and an axis, failing today)
    'np.sum': (lambda x, a: np.sum(x, axis=a), True), 'x.sum': (lambda x, a: x.sum(a), True),
    'np.mean': (lambda x, a: np.mean(x, axis=a), True), 'np.max': (lambda x, a: np.max(x, axis=a), True),
    'x.min': (lambda x, a: x.min(axis=a), True), 'np.var': (lambda x, a: np.var(x, axis=a), True),
    'x.std': (lambda x, a: x.std(axis=a), True), 'fd.logsumexp': (lambda x, a: fd.logsumexp(x, axis=a), True),
    'fd.log_softmax': (lambda x, a: fd.log_softmax(x, axis=a), False),
    'np.expand_dims': (lambda x, a: np.expand_dims(x, a), False), 'np.squeeze': (lambda x, a: np.squeeze(x[:, :1], axis=a), False),
    'np.stack': (lambda x, a: np.stack([x, 2 * x], axis=a), False), 'np.concatenate': (lambda x, a: np.concatenate([x, x], axis=a), False),
    'np.swapaxes': (lambda x, a: np.swapaxes(x, a, 0), False), 'np.sum tuple': (lambda x, a: np.sum(x, axis=(a,)), False),
}

@pytest.mark.parametrize('name', list(INT_AXIS))
def test_numpy_integer_axes(name):
    f = INT_AXIS[name][0]
    x = np.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.6]])
    weights = np.random.default_rng(0).standard_normal(np.shape(f(x, 1)))
    expected = fd.gradient(lambda x: (f(x, 1) * weights).sum(), x)            # a Python int: the reference
    close(fd.gradient(lambda x: (f(x, np.int64(1)) * weights).sum(), x), expected)
    close(fd.gradient(lambda x: (f(x, np.intp(1)) * weights).sum(), x), expected)

@pytest.mark.parametrize('join', [np.concatenate, np.stack])
def test_joins_honour_dtype(join):
    value, g = fd.value_with_gradient(lambda x: join([x, x], dtype=np.float32).sum(), np.ones(2))
    assert value.dtype == np.float32 and g.dtype == np.float64

def test_assigning_a_traced_value_into_an_array_says_so():
    "NumPy wraps any error raised while it stores an element into its own ValueError; fastad's says why, as its cause."
    def store_element(x):
        a = np.zeros(2)
        a[0] = x[0]
        return a.sum()
    def store_slice(x):
        a = np.zeros(2)
        a[:] = x
        return a.sum()
    with pytest.raises((DifferentiationError, ValueError)) as e: fd.gradient(store_element, np.ones(2))
    cause = e.value if isinstance(e.value, DifferentiationError) else (e.value.__cause__ or e.value.__context__)
    assert isinstance(cause, DifferentiationError) and 'in-place' in str(cause)
    with pytest.raises(DifferentiationError, match="in-place"): fd.gradient(store_slice, np.ones(2))

def test_errors_do_not_name_the_internal_type():
    with pytest.raises(AttributeError) as e: fd.gradient(lambda x: x.no_such_thing, np.ones(2))
    assert 'Traced' not in str(e.value)

# --- one convention for ties ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize('op', [np.maximum, np.minimum])
def test_ties_do_not_depend_on_argument_order(op):
    assert fd.gradient(lambda x: op(x, 0.0), 0.0) == fd.gradient(lambda x: op(0.0, x), 0.0)
    ga, gb = fd.gradient(lambda a, b: op(a, b), 1.0, 1.0)
    assert ga == gb

@pytest.mark.parametrize('op', [np.maximum, np.minimum, lambda a, b: np.max(np.stack([a, b])), lambda a, b: np.min(np.stack([a, b]))])
def test_tied_cotangents_add_up_to_the_whole(op):
    "Whatever the rule, at a tie the parts are a valid subgradient: they add up to the cotangent, and op(x, x) has slope 1."
    ga, gb = fd.gradient(lambda a, b: op(a, b), 1.0, 1.0)
    assert ga + gb == 1.0 and 0.0 <= ga <= 1.0
    assert fd.gradient(lambda x: op(x, x), 1.0) == 1.0

def test_relu_at_zero_is_a_subgradient():
    assert 0.0 <= fd.gradient(fd.relu, 0.0) <= 1.0

# --- found by the property tests ---------------------------------------------------------------------------------------------
def test_one_dimensional_list_times_a_traced_matrix():
    close(fd.gradient(lambda x: ([1.0, 2.0] @ x).sum(), np.ones((2, 3))), [[1.0] * 3, [2.0] * 3])
    close(fd.gradient(lambda x: np.matmul([1.0, 2.0], x).sum(), np.ones((2, 3))), [[1.0] * 3, [2.0] * 3])

def test_einsum_size_one_axis_beside_a_letter_summed_alone():
    a, b = np.arange(6.0).reshape(2, 3), np.ones((1, 1))
    ga, gb = fd.gradient(lambda a, b: np.einsum('ij,kj->i', a, b).sum(), a, b)
    close(ga, np.ones((2, 3)))
    close(gb, [[a.sum()]])                                         # b_kj broadcasts over j: its cotangent sums a

def test_third_derivative_through_indexing():
    def d(f): return lambda x: fd.gradient(lambda y: f(y).sum(), x)
    close(d(d(d(lambda z: z[1:] ** 4)))(np.full(3, 2.0)), [0.0, 48.0, 48.0])    # d^3/dz^3 z^4 = 24 z

def test_a_float_to_a_fractional_power_that_is_complex_is_refused():
    "Python's (-2.0) ** 0.5 is a complex number (NumPy's is NaN): the fast path for Python numbers must refuse it too."
    with pytest.raises(DifferentiationError, match="complex"): fd.gradient(lambda x: x ** 0.5, -2.0)
    with pytest.raises(DifferentiationError, match="complex"): fd.gradient(lambda x: (-2.0) ** x, 0.5)
    assert fd.gradient(lambda x: x ** 0.5, 4.0) == 0.25                     # a real result is fine


# ---- complex intermediates -----------------------------------------------------------------------------------------
def close(a, b, tol=1e-9): np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)

def refused_as_complex(f):
    "A complex intermediate is refused with a fastad error that says so: never a silently wrong number."
    with pytest.raises(DifferentiationError, match='complex'): f()

# --- complex intermediates --------------------------------------------------------------------------------------
def test_complex_product_then_abs():
    refused_as_complex(lambda: fd.gradient(lambda x: np.abs(x * (1 + 1j)), 2.0))

def test_astype_complex_then_abs():
    refused_as_complex(lambda: fd.gradient(lambda x: np.abs(x.astype(complex) * (1 + 1j)).sum(), np.array([2.0])))
