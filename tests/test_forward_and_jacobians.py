"""Forward mode (differential), jacobian, hessian, hessian_vector_product, argnums= and ravel, against finite
differences and against each other, through custom derivatives and checkpointing."""
import sys, warnings
from pathlib import Path
import numpy as np
import pytest
import fastad as fd
from fastad.errors import DifferentiationError

rng = np.random.default_rng(0)

# Its own: forward mode checks directional derivatives (JVPs) and whole Jacobians of vector-valued functions,
# where fastad.testing.numerical_gradient takes scalar functions only.
def central(f, x, t, eps=1e-6):
    "The directional derivative of `f` at array `x` along `t`, by central differences."
    return (np.asarray(f(x + eps * t)) - np.asarray(f(x - eps * t))) / (2 * eps)

def numerical_jacobian(f, x, eps=1e-6):
    "Output axes, then input axes, by central differences, column by column."
    x = np.asarray(x, dtype=float)
    cols = [central(f, x, e.reshape(x.shape), eps) for e in np.eye(x.size)]
    return np.moveaxis(np.array(cols), 0, -1).reshape(np.shape(f(x)) + x.shape)

FUNCTIONS = {                                   # name -> (f, input shape)
    'sin times sum': (lambda x: np.sin(x) * x.sum(), (4,)),
    'n to 1': (lambda x: (np.exp(x) * x).sum(), (5,)),
    'matrix': (lambda x: np.tanh(x @ x.T), (3, 2)),
    'wide out': (lambda x: np.outer(np.cos(x), np.arange(1., 6.)), (2,)),
    'relu mlp': (lambda x: np.maximum(x @ np.arange(12.).reshape(3, 4) / 10 - 0.3, 0).sum(1), (2, 3)),
}

@pytest.mark.parametrize('name', FUNCTIONS)
def test_jvp_matches_finite_differences_and_the_jacobian(name):
    f, shape = FUNCTIONS[name]
    x, t = rng.standard_normal(shape), rng.standard_normal(shape)
    value, d = fd.value_with_differential(f, x)
    np.testing.assert_allclose(value, f(x))
    np.testing.assert_allclose(d(t), central(f, x, t), rtol=1e-6, atol=1e-8)
    J = fd.jacobian(f, x)
    np.testing.assert_allclose(J, numerical_jacobian(f, x), rtol=1e-6, atol=1e-8)
    out_nd = np.ndim(value)
    np.testing.assert_allclose(d(t), np.tensordot(J, t, axes=t.ndim), rtol=1e-10, atol=1e-12)    # J @ t
    np.testing.assert_allclose(fd.differential(f, x)(t), d(t))

def test_jacobian_by_rows_and_by_columns_agree():
    A = rng.standard_normal((3, 5))
    wide_out, wide_in = (lambda x: np.sin(A.T @ x)), (lambda x: np.sin(A @ x))    # 5 outputs of 3; 3 of 5
    x3, x5 = rng.standard_normal(3), rng.standard_normal(5)
    np.testing.assert_allclose(fd.jacobian(wide_out, x3), np.cos(A.T @ x3)[:, None] * A.T)   # by columns
    np.testing.assert_allclose(fd.jacobian(wide_in, x5), np.cos(A @ x5)[:, None] * A)        # by rows

def test_jacobian_of_structures_nests_like_jax():
    def f(p, s): return {'u': p['a'] * s, 'v': (p['a'] ** 2).sum() + p['b'] * s}
    p, s = {'a': np.array([1., 2.]), 'b': 3.0}, 0.5
    J = fd.jacobian(f, p, s)
    assert set(J) == {'u', 'v'} and isinstance(J['u'], tuple) and set(J['u'][0]) == {'a', 'b'}
    np.testing.assert_allclose(J['u'][0]['a'], 0.5 * np.eye(2))
    np.testing.assert_allclose(J['u'][0]['b'], np.zeros(2)); np.testing.assert_allclose(J['u'][1], [1., 2.])
    np.testing.assert_allclose(J['v'][0]['a'], [2., 4.]); assert J['v'][0]['b'] == 0.5 and J['v'][1] == 3.0

def test_jacobian_keeps_float32_and_floats():
    assert fd.jacobian(lambda x: np.sin(x), np.ones(3, np.float32)).dtype == np.float32
    j = fd.jacobian(lambda x: x ** 3, 2.0)
    assert type(j) is float and j == 12.0
    np.testing.assert_allclose(fd.jacobian(lambda s: s * np.arange(3.), 2.0), np.arange(3.))   # 1 -> n: shape (3,)

def test_hessian_is_symmetric_and_matches_finite_differences():
    C = rng.standard_normal((4, 4))
    def f(x): return np.log1p((x @ C) ** 2).sum() + (np.sin(x) * x[::-1]).sum()
    x = rng.standard_normal(4)
    H = fd.hessian(f, x)
    np.testing.assert_allclose(H, H.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(H, numerical_jacobian(fd.gradient(f), x), rtol=1e-5, atol=1e-7)
    v = rng.standard_normal(4)
    np.testing.assert_allclose(fd.hessian_vector_product(f, x, v), H @ v, rtol=1e-10)
    np.testing.assert_allclose(fd.differential(fd.gradient(f), x)(v), H @ v, rtol=1e-10)     # forward over reverse

def test_hessian_of_several_arguments_and_of_a_matrix():
    H = fd.hessian(lambda x, y: x * x * y + y ** 3, 2.0, 3.0)
    assert H == ((6.0, 4.0), (4.0, 18.0))
    Hm = fd.hessian(lambda m: (m ** 3).sum(), np.ones((2, 3)))
    assert Hm.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(Hm.reshape(6, 6), 6 * np.eye(6))

def test_hessian_vector_product_on_a_model():
    layer = fd.Dense(weight=rng.standard_normal((3, 2)), bias=np.zeros(2))
    x = rng.standard_normal((5, 3))
    loss = lambda m: (np.tanh(m(x)) ** 2).sum()
    v = fd.Dense(weight=rng.standard_normal((3, 2)), bias=rng.standard_normal(2))
    hv = fd.hessian_vector_product(loss, layer, v)
    assert type(hv) is fd.Dense
    flat, unravel = fd.ravel(layer)
    H = fd.hessian(lambda w: loss(unravel(w)), flat)
    np.testing.assert_allclose(fd.ravel(hv)[0], H @ fd.ravel(v)[0], rtol=1e-9, atol=1e-12)

def test_forward_mode_through_custom_derivatives():
    x, t = np.array([-1., 0.25, 2.]), np.array([0.5, -2., 1.])
    softplus = fd.differentiable_function(lambda x: (np.log1p(np.exp(x)), lambda v: v / (1 + np.exp(-x))), name='softplus')
    np.testing.assert_allclose(fd.differential(softplus, x)(t), t / (1 + np.exp(-x)))
    def clipped_square(x): return x * x
    with fd.derivative(of=clipped_square, vjp=lambda x: (clipped_square(x), lambda g: g * np.clip(2 * x, -1, 1))):
        np.testing.assert_allclose(fd.differential(lambda x: clipped_square(x) + 1, x)(t), t * np.clip(2 * x, -1, 1))
    two = fd.differentiable_function(lambda a, b: (a * b, lambda g: (g * b, g * a)), name='times')
    assert fd.differential(two, 2.0, 3.0)(1.0, 10.0) == 3.0 + 20.0

def test_forward_mode_through_checkpointing():
    x, t = rng.standard_normal(4), rng.standard_normal(4)
    runs = []
    def body(x):
        runs.append(1)
        return np.tanh(x) * 2
    recomputed = fd.make_recomputed_in_gradient(body)
    np.testing.assert_allclose(fd.differential(recomputed, x)(t), 2 * t * (1 - np.tanh(x) ** 2))
    assert len(runs) >= 2                                         # recomputed in the pullback, as promised
    layer = fd.Dense(weight=rng.standard_normal((4, 3)), bias=np.zeros(3), activation=np.tanh)
    discarding = layer.discarding_activations()
    np.testing.assert_allclose(fd.differential(lambda x: discarding(x), x[None])(t[None]),
                               fd.differential(lambda x: layer(x), x[None])(t[None]))

def test_forward_mode_takes_a_clipping_hook_where_it_is_linear():
    def f(x):
        y = fd.with_derivative(np.sin(x), lambda g: np.clip(g, -1, 1))   # linear only for cotangents in [-1, 1]
        return np.concatenate([y, 2 * y])
    x = np.array([0.3, 0.7])
    expected = np.array([[np.cos(.3), 0], [0, np.cos(.7)], [2 * np.cos(.3), 0], [0, 2 * np.cos(.7)]])
    np.testing.assert_allclose(fd.jacobian(lambda x: f(x)[:2], x), expected[:2])   # by rows: cotangents 0 or 1
    np.testing.assert_allclose(fd.jacobian(f, x), expected)             # 4 results of 2 arguments: by columns (all 0 before)
    np.testing.assert_allclose(fd.differential(f, x)(np.array([1., 2.])), expected @ [1., 2.])
    for dtype in (np.float32, np.float16):
        np.testing.assert_allclose(fd.differential(f, x.astype(dtype))(np.ones(2, dtype)), expected.sum(1), rtol=2e-3)

def test_differential_nests_inside_gradient():
    assert np.isclose(fd.gradient(lambda x: fd.differential(np.sin, x)(1.0), 0.3), -np.sin(0.3))

def test_differential_of_a_constant_function_is_zero_and_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        d = fd.differential(lambda x: np.ones(2), np.ones(2))(np.ones(2))
    np.testing.assert_array_equal(d, np.zeros(2))
    assert [type(w.message) for w in caught] == [fd.ZeroDerivativeWarning]

def test_differential_errors_name_the_tangent():
    d = fd.differential(lambda a, b: a * b, np.ones(2), np.ones(2))
    with pytest.raises(DifferentiationError, match='one tangent per argument'): d(np.ones(2))
    with pytest.raises(DifferentiationError, match=r'tangent 1 has shape \(3,\)'): d(np.ones(2), np.ones(3))

# argnums

def loss(w, data, power, label):
    assert isinstance(label, str)
    return (np.abs(data @ w) ** power).sum()

W, DATA = np.array([0.5, -1.]), np.array([[1., 2.], [3., 4.]])

def test_argnums_int_tuple_and_negative_in_every_transform():
    g_w = 2 * DATA.T @ (DATA @ W) * np.sign(DATA @ W) * np.sign(DATA @ W)
    args = (W, DATA, 2, 'train')
    np.testing.assert_allclose(fd.gradient(loss, *args, argnums=0), g_w)
    np.testing.assert_allclose(fd.gradient(loss, *args, argnums=-4), g_w)
    np.testing.assert_allclose(fd.gradient(loss, argnums=0)(*args), g_w)
    one = fd.gradient(loss, *args, argnums=(0,))
    assert type(one) is tuple and len(one) == 1
    gw, gd = fd.gradient(loss, *args, argnums=(0, 1))
    np.testing.assert_allclose(gd, 2 * np.outer(DATA @ W, W))
    gd2, gw2 = fd.gradient(loss, *args, argnums=(1, 0))                    # in the order asked
    np.testing.assert_allclose(gw2, gw); np.testing.assert_allclose(gd2, gd)
    value, g = fd.value_with_gradient(loss, *args, argnums=0)
    assert value == loss(*args); np.testing.assert_allclose(g, g_w)
    value, pb = fd.value_with_pullback(loss, *args, argnums=(0,))
    np.testing.assert_allclose(pb(2.0)[0], 2 * g_w)
    np.testing.assert_allclose(fd.pullback(loss, *args, argnums=0)(1.0), g_w)
    np.testing.assert_allclose(fd.jacobian(loss, *args, argnums=0), g_w)
    np.testing.assert_allclose(fd.hessian(loss, *args, argnums=0), 2 * DATA.T @ DATA)
    Hs = fd.hessian(loss, *args, argnums=(0,))
    assert type(Hs) is tuple and type(Hs[0]) is tuple
    np.testing.assert_allclose(Hs[0][0], 2 * DATA.T @ DATA)

def test_arguments_not_differentiated_may_be_anything():
    def f(x, config, data, fn, nothing): return fn(x * config['scale']) * len(data)
    g = fd.gradient(f, 2.0, {'scale': 3, 'name': 'a'}, ['a', 'b'], np.sin, None, argnums=0)
    assert np.isclose(g, 2 * 3 * np.cos(6.0))

@pytest.mark.parametrize('argnums, message', [
    (2, 'argnums=2 is out of range'), (-3, 'argnums=-3 is out of range'), ((0, 5), 'argnums=(0, 5) is out of range'),
    ('0', 'argnums must be an int'), (True, 'argnums must be an int'), ((), 'argnums must be an int'),
    (1.0, 'argnums must be an int'), ((0, 0), 'names an argument twice'), ((0, -2), 'names an argument twice')])
@pytest.mark.parametrize('transform', [fd.gradient, fd.value_with_gradient, fd.pullback, fd.value_with_pullback,
                                       fd.jacobian, fd.hessian])
def test_bad_argnums_are_fastad_errors(transform, argnums, message):
    with pytest.raises(DifferentiationError, match=message.replace('(', r'\(').replace(')', r'\)')):
        transform(lambda x, y: (x * y).sum(), np.ones(2), np.ones(2), argnums=argnums)

@pytest.mark.parametrize('bad', [3, np.arange(3), 'train'])
def test_an_argument_that_cannot_be_differentiated_points_to_argnums(bad):
    with pytest.raises(DifferentiationError, match=r'argument 1 is .*with argnums='):
        fd.gradient(lambda x, n: x * 2, 1.0, bad)
    with pytest.raises(DifferentiationError) as info:                 # inside a structure: no argnums to suggest
        fd.gradient(lambda p: p[0] * 2, (1.0, bad))
    assert 'argnums' not in str(info.value)

# ravel

class Tiny(fd.Differentiable):
    w: np.ndarray
    b: float
    name: str = fd.nondifferentiable(default='tiny')

TREES = {
    'model': lambda: fd.Dense(weight=rng.standard_normal((3, 2)).astype(np.float32), bias=np.zeros(2, np.float32)),
    'dict': lambda: {'a': rng.standard_normal(3), 'b': {'c': rng.standard_normal((2, 2))}},
    'list': lambda: [rng.standard_normal(2), 1.5, (rng.standard_normal(1),)],
    'float32': lambda: np.ones((2, 3), np.float32),
    'float': lambda: 2.5,
    'dataclass with a float and a static field': lambda: Tiny(np.arange(3.), 0.5),
}

def same_tree(a, b):
    la, lb = fd.tree.flatten(a, static_ok=True)[0], fd.tree.flatten(b, static_ok=True)[0]
    assert type(a) is type(b) and len(la) == len(lb)
    for x, y in zip(la, lb):
        assert type(x) is type(y) and np.shape(x) == np.shape(y) and getattr(x, 'dtype', None) == getattr(y, 'dtype', None)
        np.testing.assert_array_equal(x, y)

@pytest.mark.parametrize('name', TREES)
def test_ravel_round_trip(name):
    tree = TREES[name]()
    vector, unravel = fd.ravel(tree)
    assert vector.ndim == 1 and vector.size == sum(np.size(l) for l in fd.tree.flatten(tree, static_ok=True)[0])
    same_tree(unravel(vector), tree)
    if name in ('model', 'float32'): assert vector.dtype == np.float32

@pytest.mark.parametrize('name', TREES)
def test_ravel_is_differentiable_both_ways(name):
    tree = TREES[name]()
    vector, unravel = fd.ravel(tree)
    weights = np.linspace(1, 2, vector.size)
    g_tree = fd.gradient(lambda t: (fd.ravel(t)[0] ** 2 * weights).sum(), tree)      # through ravel
    same_tree(g_tree, unravel(2 * vector * weights))
    g_vec = fd.gradient(lambda v: (fd.ravel(unravel(v))[0] ** 3).sum(), vector)      # through unravel
    np.testing.assert_allclose(g_vec, 3 * vector.astype(float) ** 2, rtol=1e-6)
    assert g_vec.dtype == vector.dtype

def test_ravel_keeps_static_fields_and_checks_the_vector():
    vector, unravel = fd.ravel(Tiny(np.arange(3.), 0.5, name='kept'))
    back = unravel(vector * 2)
    assert back.name == 'kept' and back.b == 1.0 and type(back.b) is float
    vector2, unravel2 = fd.ravel({'a': np.ones(2), 'steps': 4, 'name': 'x'})     # ints and strings ride along
    assert vector2.size == 2
    back2 = unravel2(vector2 + 1)
    assert back2['steps'] == 4 and back2['name'] == 'x'; np.testing.assert_array_equal(back2['a'], [2., 2.])
    with pytest.raises(DifferentiationError, match='a vector of 4 numbers'): unravel(np.ones(5))
    with pytest.raises(DifferentiationError, match='a vector of 4 numbers'): unravel(np.ones((2, 2)))

def test_lbfgs_trains_a_model_through_ravel():
    minimize = pytest.importorskip('scipy.optimize', reason='SciPy is not installed (optional): pip install scipy').minimize
    X = rng.standard_normal((50, 3)); y = X @ np.array([1., -2., 0.5]) + 0.3
    model = fd.Dense(weight=np.zeros((3, 1)), bias=np.zeros(1), activation=None)
    x0, unravel = fd.ravel(model)
    fun = lambda v: fd.value_with_gradient(lambda v: ((unravel(v)(X)[:, 0] - y) ** 2).mean(), v)
    result = minimize(fun, x0, jac=True, method='L-BFGS-B')
    trained = unravel(result.x)
    np.testing.assert_allclose(trained.weight[:, 0], [1., -2., 0.5], atol=1e-4)
    np.testing.assert_allclose(trained.bias, [0.3], atol=1e-4)

def test_forward_benchmark_runs_and_checks_the_jvp(capsys):
    sys.path.insert(0, str(Path(__file__).parent.parent))          # bench/ is a folder of the repository, not installed
    from bench import forward
    forward.main(['--quick', '--rounds', '1'])
    out = capsys.readouterr().out
    assert out.count('differential / pullback = ') == 2

def test_hessian_vector_product_checks_v_and_takes_none_for_zeros():
    f = lambda p: (p['a'] ** 2).sum() * p['b']
    hv = fd.hessian_vector_product(f, {'a': np.ones(2), 'b': 2.0}, {'a': np.ones(2), 'b': None})
    np.testing.assert_allclose(hv['a'], [4., 4.]); assert hv['b'] == 4.0
    with pytest.raises(DifferentiationError, match=r'v has shape \(3,\) where x has shape \(2,\)'):
        fd.hessian_vector_product(lambda x: (x ** 3).sum(), np.ones(2), np.ones(3))

def test_jacobian_inside_gradient():
    g = fd.gradient(lambda a: np.trace(fd.jacobian(lambda x: np.sin(x * a), np.ones(3))), 2.0)
    assert np.isclose(g, 3 * (np.cos(2.0) - 2 * np.sin(2.0)))

# pullbacks that cannot take a traced cotangent

def relu_with(kind):
    "max(x, 0) with a custom pullback written as `kind`: fine on plain cotangents, not on traced ones."
    def vjp(x):
        m = x > 0
        def pb(g):
            if kind == 'setitem':
                out = np.zeros_like(x); out[m] = g[m]; return out
            if kind == 'asarray': return np.asarray(g) * m
            buf = np.empty_like(x); np.multiply(g, m, out=buf); return buf
        return np.maximum(x, 0), pb
    return fd.differentiable_function(vjp, name=f'relu_{kind}')

LINES = {'setitem': 'out = np.zeros_like(x); out[m] = g[m]; return out', 'asarray': "if kind == 'asarray': return np.asarray(g) * m",
         'out': 'buf = np.empty_like(x); np.multiply(g, m, out=buf); return buf'}

@pytest.mark.parametrize('kind', LINES)
def test_a_pullback_that_makes_a_plain_array_is_named_in_forward_mode(kind):
    relu, x = relu_with(kind), np.array([-1., 0.5, 2.])
    np.testing.assert_array_equal(fd.gradient(lambda x: relu(x).sum(), x), [0., 1., 1.])   # reverse mode: fine
    hessian = lambda: fd.hessian(lambda x: (relu(x) ** 2).sum(), x)
    if kind == 'setitem':        # reverse over reverse: x is traced there, so np.zeros_like(x) takes the traced writes
        np.testing.assert_array_equal(hessian(), np.diag([0., 2., 2.]))
    for run, mode in [(lambda: fd.differential(relu, x)(np.ones(3)), 'forward mode'),
                      (lambda: fd.jacobian(lambda x: np.outer(relu(x), x), x), 'forward mode'),
                      *([] if kind == 'setitem' else [(hessian, 'reverse over reverse')])]:
        with pytest.raises(DifferentiationError) as info: run()
        message = str(info.value)
        assert mode in message and f"{__file__}:" in message and LINES[kind] in message, message
        assert 'np.where(m, g, 0)' in message
        assert isinstance(info.value.__cause__, DifferentiationError)

def test_a_pullback_that_calls_scipy_is_named_at_its_own_line_not_scipys():
    ndimage = pytest.importorskip('scipy.ndimage', reason='SciPy is not installed (optional): pip install scipy')
    def vjp(x):
        def pb(g): return ndimage.gaussian_filter1d(g, 1.0)       # SciPy makes g a plain array inside
        return x * 1.0, pb
    smooth, x = fd.differentiable_function(vjp, name='smooth'), np.array([1., 2., 3.])
    with pytest.raises(DifferentiationError) as info: fd.differential(smooth, x)
    message = str(info.value)
    assert f"{__file__}:" in message and 'return ndimage.gaussian_filter1d(g, 1.0)' in message, message

def test_a_forward_function_that_makes_a_plain_array_keeps_its_own_error():
    with pytest.raises(DifferentiationError, match='cannot become a plain NumPy array') as info:
        fd.differential(lambda x: np.asarray(x) * x, np.ones(2))
    assert 'forward mode' not in str(info.value)

# empty arguments, argnums in forward mode

def test_jacobian_of_an_empty_argument_or_result():
    J = fd.jacobian(lambda x: np.ones(3) * x.sum(), np.zeros(0))              # by columns, none of them: JAX's (3, 0)
    assert J.shape == (3, 0) and J.dtype == np.float64
    assert fd.jacobian(lambda x: x[:0] * 2, np.ones(2)).shape == (0, 2)       # by rows, none of them
    J32 = fd.jacobian(lambda x: np.ones((2, 2), np.float32) * x.sum(), np.zeros((0, 3), np.float32))
    assert J32.shape == (2, 2, 0, 3) and J32.dtype == np.float32

def test_differential_takes_argnums():
    f = lambda w, data, label: np.sin(data @ w) * len(label)
    w, data = np.array([0.5, -1.]), np.array([[1., 2.], [3., 4.], [0., 1.]])
    t = np.array([1., 2.])
    expected = 2 * np.cos(data @ w) * (data @ t)
    value, d = fd.value_with_differential(f, w, data, 'ab', argnums=0)
    np.testing.assert_allclose(value, f(w, data, 'ab')); np.testing.assert_allclose(d(t), expected)
    np.testing.assert_allclose(fd.differential(f, w, data, 'ab', argnums=-3)(t), expected)
    np.testing.assert_allclose(fd.differential(f, w, data, 'ab', argnums=(0,))(t), expected)
    both = fd.differential(f, w, data, 'ab', argnums=(1, 0))(np.zeros_like(data), t)       # in the order asked
    np.testing.assert_allclose(both, expected)
    with pytest.raises(DifferentiationError, match=r'argnums=3 is out of range'): fd.differential(f, w, data, 'ab', argnums=3)

# hessian of a vector-valued function

def test_hessian_of_a_vector_valued_function_is_output_then_input_twice():
    C = rng.standard_normal((3, 4))
    f = lambda x: np.tanh(C @ x) * x[:3] ** 2                                  # R^4 -> R^3
    x = rng.standard_normal(4)
    H = fd.hessian(f, x)
    assert H.shape == (3, 4, 4)
    np.testing.assert_allclose(H, np.transpose(H, (0, 2, 1)), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(H, numerical_jacobian(lambda x: fd.jacobian(f, x), x), rtol=1e-6, atol=1e-8)
    for i in range(3): np.testing.assert_allclose(H[i], fd.hessian(lambda x: f(x)[i], x), rtol=1e-10, atol=1e-12)
    wide = lambda x: np.outer(np.sin(x), x)                                    # R^2 -> R^(2x2): (2, 2, 2, 2)
    np.testing.assert_allclose(fd.hessian(wide, np.array([0.3, 2.])), numerical_jacobian(lambda x: fd.jacobian(wide, x), np.array([0.3, 2.])),
                               rtol=1e-6, atol=1e-8)

def test_hessian_of_a_structured_result_nests_like_jax():
    f = lambda x, y: {'v': np.sin(x) * y, 's': (x ** 2).sum() * y}
    x, y = np.array([0.5, 1.5]), 2.0
    H = fd.hessian(f, x, y)                                    # result -> (d/dx, d/dy) -> (d/dx, d/dy)
    assert set(H) == {'v', 's'}
    (vxx, vxy), (vyx, vyy) = H['v']
    assert vxx.shape == (2, 2, 2) and vxy.shape == (2, 2) and vyx.shape == (2, 2) and vyy.shape == (2,)
    np.testing.assert_allclose(vxx, np.einsum('ij,jk->ijk', np.diag(-np.sin(x) * y), np.eye(2)))
    np.testing.assert_allclose(vxy, np.diag(np.cos(x))); np.testing.assert_allclose(vyy, 0)
    np.testing.assert_allclose(H['s'][0][0], 2 * y * np.eye(2)); np.testing.assert_allclose(H['s'][0][1], 2 * x)
    Ha = fd.hessian(f, x, y, argnums=(0,))
    assert type(Ha['v']) is tuple and type(Ha['v'][0]) is tuple and Ha['v'][0][0].shape == (2, 2, 2)
    assert fd.hessian(f, x, y, argnums=0)['v'].shape == (2, 2, 2)

def test_a_scalar_hessian_is_unchanged_and_a_nested_error_still_shows():
    assert fd.hessian(lambda x: x ** 3, 2.0) == 12.0
    with pytest.raises(DifferentiationError, match='needs a scalar result'):   # raised inside f, about another function
        fd.hessian(lambda x: fd.gradient(lambda y: y * x, x), np.ones(2))

# ravel inside a transform

def test_unravel_keeps_each_leafs_dtype_inside_a_gradient():
    tree = {'a': np.float32(1e8) * np.ones(1, np.float32), 'b': np.ones(2)}
    vector, unravel = fd.ravel(tree)                                           # float64: the leaves' common dtype
    def f(v):
        a = unravel(v)['a']
        assert a.dtype == np.float32
        return (((a + 1) - a) * v[0]).sum()                                   # float32: 1e8 + 1 rounds back to 1e8
    assert f(vector) == 0.0
    g = fd.gradient(f, vector)
    assert g.dtype == vector.dtype
    np.testing.assert_array_equal(g, [0., 0., 0.])                             # was 1.0 traced, 1e8 + 1 in float64
    g32 = fd.gradient(lambda v: (unravel(v)['b'] ** 2).sum(), vector.astype(np.float32))
    assert g32.dtype == np.float32 and unravel(vector.astype(np.float32))['b'].dtype == np.float64

def test_hessian_of_a_vector_valued_function_on_every_backend(any_backend):
    "The inner Jacobian runs on traced values: its one-hots are made on the device of the values under them."
    from fastad.backend import to_device, to_host
    x = np.array([0.3, 0.5, 1.0])
    f = lambda x: (np.sin(x) * x.sum())[:2]
    H = to_host(fd.hessian(f, to_device(x)))
    assert H.shape == (2, 3, 3)
    np.testing.assert_allclose(H, numerical_jacobian(lambda x: fd.jacobian(f, x), x), rtol=1e-6, atol=1e-8)
    J0 = fd.jacobian(lambda x: x.sum() * 2, to_device(np.zeros((0, 2))))
    assert J0.shape == (0, 2)
