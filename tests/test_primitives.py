"""Every primitive, through the public transforms, against central differences in float64 on random shapes.

For a function f and a random cotangent v, the pullback must return J^T v; its dot product with a random
direction d must equal the directional derivative of <v, f(x)> along d, which central differences
estimate to ~1e-9. Each case also runs under the strict backend (no silent host copies) via `any_backend`.
"""
import contextlib, warnings
import numpy as np, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from hypothesis.extra.numpy import mutually_broadcastable_shapes, valid_tuple_axes
import fastad as fd
from fastad.backend import to_device, to_host, array_module, get_backend, use_backend
from fastad.strict import StrictArray

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
