"""The transforms on structures, their error paths, and the custom-derivative API."""
import warnings
from collections import namedtuple
import numpy as np, pytest
import fastad as fd
from fastad.primitives import REGISTRY
from fastad.errors import DifferentiationError, NonScalarOutputError, NoDerivativeError
from fastad.backend import to_device, to_host
from fastad.tree import flatten

def close(a, b): np.testing.assert_allclose(to_host(a), to_host(b), rtol=1e-9, atol=1e-12)

# --- structures ---------------------------------------------------------------------------------------
Pair = namedtuple('Pair', 'a b')

class Inner(fd.Differentiable):
    w: np.ndarray
    scale: float = 2.0

class Outer(fd.Differentiable):
    inner: Inner
    bias: float
    name: str = fd.nondifferentiable(default='outer')
    activation: object = fd.nondifferentiable(default=np.tanh)
    steps: int = 3                                       # an int in a model rides along without marking

def test_nested_structures_keep_their_shape():
    x = {'t': (1.0, np.ones(2)), 'l': [np.full(3, 2.0)], 'p': Pair(3.0, np.zeros(1))}
    g = fd.gradient(lambda d: d['t'][0] * d['t'][1].sum() + (d['l'][0] ** 2).sum() + d['p'].a * 2, x)
    assert list(g) == ['t', 'l', 'p'] and type(g['t']) is tuple and type(g['l']) is list and type(g['p']) is Pair
    close(g['t'][1], [1., 1.]); close(g['l'][0], [4., 4., 4.]); assert g['t'][0] == 2.0 and g['p'].a == 2.0
    close(g['p'].b, [0.0])                                # unused: zeros of the same shape

def test_nested_dataclasses():
    m = Outer(Inner(np.array([1.0, -1.0])), 0.5)
    def loss(m): return m.activation(m.inner.w * m.inner.scale + m.bias).sum() * m.steps
    g = fd.gradient(loss, m)
    assert type(g) is Outer and type(g.inner) is Inner and (g.name, g.activation, g.steps) == ('outer', np.tanh, 3)
    pre = m.inner.w * 2.0 + 0.5
    close(g.inner.w, 3 * 2.0 / np.cosh(pre) ** 2); close(g.bias, (3 / np.cosh(pre) ** 2).sum())
    close(g.inner.scale, (3 * m.inner.w / np.cosh(pre) ** 2).sum())
    assert m.inner.w.tolist() == [1.0, -1.0]            # the argument is untouched

def test_models_on_every_backend(any_backend):
    m = Outer(Inner(to_device(np.array([1.0, -1.0]))), 0.5)
    pair = Pair(to_device(np.ones(2, np.float32)), 2.0)
    gm, gp = fd.gradient(lambda m, p: (m.activation(m.inner.w * m.bias) * p.a).sum() * p.b, m, pair)
    assert type(gm.inner.w) is type(m.inner.w) and gm.inner.w.dtype == np.float64 and type(gm.bias) is float
    assert type(gp) is Pair and type(gp.a) is type(pair.a) and gp.a.dtype == np.float32 and type(gp.b) is float
    close(gm.inner.w, 2 * 0.5 / np.cosh([0.5, -0.5]) ** 2); np.testing.assert_allclose(to_host(gp.a), 2 * np.tanh([0.5, -0.5]), rtol=1e-6)

def test_integers_are_refused_naming_the_argument():
    with pytest.raises(DifferentiationError, match="argument 1 is an integer"): fd.gradient(lambda a, b: a * b, 1.0, 2)
    with pytest.raises(DifferentiationError, match=r"argument 0\[1\] is an integer \(ndarray of int64\)"):
        fd.gradient(lambda t: t[0], (1.0, np.arange(3)))
    with pytest.raises(DifferentiationError, match="argument 0 is a str"): fd.gradient(len, 'abc')

def test_non_scalar_results_point_to_pullback():
    with pytest.raises(NonScalarOutputError, match=r"shape \(3,\).*pullback"): fd.gradient(np.sin, np.ones(3))
    with pytest.raises(NonScalarOutputError, match="result has a tuple"): fd.gradient(lambda x: (x, x), 1.0)

def test_pullbacks():
    value, pb = fd.value_with_pullback(lambda x: (np.sin(x), x * 2), np.array([0.0, 1.0]))
    gs = [pb((np.ones(2), np.zeros(2))), pb((np.zeros(2), np.ones(2)))]
    close(gs[0], np.cos([0.0, 1.0])); close(gs[1], [2.0, 2.0])
    with pytest.raises(DifferentiationError, match="the cotangent is a ndarray, but it should be shaped like the value it belongs to: a tuple"): pb(np.ones(2))
    with pytest.raises(DifferentiationError, match=r"cotangent has shape \(3,\) but the result has shape \(2,\)"):
        pb((np.ones(3), np.ones(2)))
    v = (np.ones(2), np.ones(2))
    first = pb(v)
    for _ in range(3): close(pb(v), first)                 # callable many times, same answer
    assert v[0].tolist() == [1.0, 1.0] and v[1].tolist() == [1.0, 1.0]   # the cotangent is not changed
    with pytest.raises(DifferentiationError, match="f must be callable"): fd.pullback(3.0, 1.0)
    with pytest.raises(DifferentiationError, match="no arguments"): fd.value_with_pullback(np.sin)

def test_gradient_forms():
    assert fd.gradient(lambda x, y: x * y, 2.0, 3.0) == (3.0, 2.0)
    g = fd.gradient(lambda x: x ** 2)
    assert g(3.0) == 6.0 and g.__name__ == 'gradient_of_<lambda>'
    assert fd.value_with_gradient(lambda x: x ** 2, 3.0) == (9.0, 6.0)

def test_zero_derivative_warns_unless_stopped_on_purpose():
    with pytest.warns(fd.ZeroDerivativeWarning, match="does not depend.*say so with without_derivative"):
        assert fd.gradient(lambda x: np.floor(x) * 2 + 5.0, 1.5) == 0.0
    with pytest.warns(fd.ZeroDerivativeWarning):
        assert fd.gradient(lambda x, y: 3.0, 1.0, 2.0) == (0.0, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        fd.gradient(np.sin, 1.0)                          # no warning when the result depends on x
        assert fd.gradient(lambda x: 5.0 + 0 * fd.without_derivative(x), 1.0) == 0.0        # said on purpose
        assert fd.gradient(lambda d: fd.without_derivative(d)['a'] * 2, {'a': 1.0}) == {'a': 0.0}
        assert fd.gradient(lambda x: x * fd.gradient(lambda y: fd.without_derivative(y) * x, 1.0), 2.0) == 0.0

# --- custom derivatives -----------------------------------------------------------------------------------
def cube_root(x): return np.cbrt(x)                       # its rule is taken out of the table below

def test_derivative_of_a_python_function():
    calls = []
    def slow_square(x): return x * x
    @fd.derivative(of=slow_square)
    def slow_square_vjp(x):
        calls.append(x)
        return slow_square(x), lambda v: v * 2 * x * 10    # deliberately not the true derivative: must be used
    assert fd.gradient(slow_square, 3.0) == 60.0 and len(calls) == 1
    assert fd.gradient(lambda x: slow_square(x) + 1, 3.0) == 60.0   # also when called by name inside another function
    assert slow_square(3.0) == 9.0                                  # plain calls compute as before

def test_derivative_of_a_numpy_function():
    "A registration for a NumPy ufunc takes over from fastad's own rule; undoing it gives that rule back."
    with pytest.raises(NoDerivativeError, match=r"numpy.ldexp has no derivative"): fd.gradient(lambda x: np.ldexp(x, 2).sum(), np.ones(2))
    builtin, calls = REGISTRY[np.cbrt].rule, []
    @fd.derivative(of=np.cbrt)
    def cbrt_vjp(x):
        y = np.cbrt(x)
        calls.append(x)
        return y, lambda v: v / (3 * y * y)
    with fd.registered_derivative(np.cbrt):                                     # registrations are global: undone on leaving
        assert cbrt_vjp.__name__ == 'cbrt_vjp'                                  # the decorator returns the VJP
        close(fd.gradient(lambda x: cube_root(x).sum(), np.array([1.0, 8.0])), [1 / 3, 1 / 12])
        assert len(calls) == 1                                                  # the registered rule ran, not fastad's
        assert np.cbrt(8.0) == 2.0                                              # plain calls are untouched
    assert fd.registered_derivative(np.cbrt) is None and REGISTRY[np.cbrt].rule is builtin

def test_derivative_of_something_that_is_not_callable():
    with pytest.raises(DifferentiationError, match="`of` must be a function"): fd.derivative(of=3)(lambda x: (x, None))

def test_differentiable_function_with_one_input(any_backend):
    def softplus_vjp(x):
        y = np.log1p(np.exp(x))
        return y, lambda v: v / (1 + np.exp(-x))
    softplus = fd.differentiable_function(softplus_vjp)
    x = to_device(np.array([-1.0, 0.0, 2.0]))
    g = fd.gradient(lambda x: softplus(x).sum(), x)
    assert type(g) is type(x) and softplus.__name__ == 'softplus_vjp'
    close(g, 1 / (1 + np.exp(-np.array([-1.0, 0.0, 2.0]))))
    close(fd.gradient(fd.gradient(softplus), 0.0), 0.25)              # a pullback in NumPy is differentiable again

def test_differentiable_function_with_several_inputs():
    calls = []
    def vjp(a, b, c):
        def pb(v):
            calls.append(v)
            return v * b * c, v * a * c, v * a * b
        return a * b * c, pb
    prod3 = fd.differentiable_function(vjp, name='prod3')
    assert fd.gradient(prod3, 2.0, 3.0, 4.0) == (12.0, 8.0, 6.0) and len(calls) == 1   # one pullback call for all three
    assert prod3(2.0, 3.0, 4.0) == 24.0 and prod3.__name__ == 'prod3'
    close(fd.gradient(lambda x: prod3(x, 2.0, 3.0), 1.0), 6.0)                          # only one input traced

def test_without_derivative_on_structures():
    d = fd.without_derivative({'a': 1.0, 'b': [np.ones(2)]})
    assert d['a'] == 1.0 and d['b'][0].tolist() == [1.0, 1.0]
    assert fd.gradient(lambda x: x * fd.without_derivative(x), 3.0) == 3.0
    assert fd.gradient(lambda x, y: np.sin(np.sin(x)) + fd.without_derivative(np.cos(y)), 2.0, 3.0)[1] == 0.0

def test_with_derivative_hooks():
    seen = []
    assert fd.gradient(lambda x: fd.with_derivative(np.sin(x), seen.append) + np.log(x), 30.0) == np.cos(30.0) + 1 / 30
    assert seen == [1.0]
    def rewrite(g): return 0.5                                              # derivative surgery: replace the cotangent
    assert fd.gradient(lambda x: np.sin(x) + np.log(fd.with_derivative(x, rewrite)), np.float32(30.0)) == np.float32(0.65425146)

def test_in_place_hook_does_not_corrupt_shared_cotangents():
    def double(g): g *= 2                                 # changes its (own) copy in place
    # x + x hands the same cotangent array to both uses; only the hooked path may be doubled
    g = fd.gradient(lambda x: (fd.with_derivative(x, double) + x).sum(), np.ones(3))
    close(g, [3.0, 3.0, 3.0])
    g = fd.gradient(lambda x: fd.with_derivative(x, double).mean(), np.ones(4))   # a read-only broadcast view inside
    close(g, np.full(4, 0.5))

def test_hook_must_be_callable():
    with pytest.raises(DifferentiationError, match="hook must be callable"): fd.with_derivative(1.0, 3)

import ctypes, ctypes.util
_libm = ctypes.CDLL(ctypes.util.find_library('m'))
c_exp = _libm.exp                                         # a C function: it never sees a traced value
c_exp.restype, c_exp.argtypes = ctypes.c_double, [ctypes.c_double]

def test_derivative_of_a_c_function():
    def c_exp_vjp(x):
        y = c_exp(x)
        return y, lambda v: v * y
    with fd.derivative(of=c_exp, vjp=c_exp_vjp):
        close(fd.gradient(lambda x: c_exp(x) * 2, 1.5), 2 * np.exp(1.5))   # the module-level name now differentiates
        close(c_exp(1.0), np.e)                                             # and plain calls still reach C
    assert type(c_exp) is type(_libm.exp)                                   # undone: the name is the C function again

# --- custom derivatives whose arguments are structures (a layer and its input) --------------------------
class Affine(fd.Differentiable):
    w: np.ndarray
    b: np.ndarray
    activation: object = fd.nondifferentiable(default=None)

def affine_vjp(layer, x):
    "A linear layer's VJP written by hand, with its weight cotangent deliberately scaled by 10 to prove it is used."
    y = x @ layer.w + layer.b
    return y, lambda g: (Affine(10 * (x.T @ g), g.sum(0), layer.activation), g @ layer.w.T)

affine = fd.differentiable_function(affine_vjp, name='affine')

def test_custom_derivative_of_a_model_and_its_input_is_used(any_backend):
    r = np.random.default_rng(0)
    layer = Affine(to_device(r.standard_normal((3, 2))), to_device(r.standard_normal(2)), 'relu')
    x = to_device(r.standard_normal((4, 3)))
    with fd.trace_primitives() as log:
        g_layer, g_x = fd.gradient(lambda l, x: (affine(l, x) ** 2).sum(), layer, x)
    assert log.count('forward', 'affine') == 1 and log.count('forward', 'matmul') == 0   # one step, not its insides
    y = x @ layer.w + layer.b
    close(g_layer.w, 10 * (x.T @ (2 * y))); close(g_layer.b, (2 * y).sum(0)); close(g_x, (2 * y) @ layer.w.T)
    assert type(g_layer) is Affine and g_layer.activation == 'relu' and type(g_x) is type(x)

def test_custom_derivative_with_structures_outside_transforms_and_with_static_arguments():
    layer, x = Affine(np.ones((3, 2)), np.zeros(2)), np.ones((4, 3))
    close(affine(layer, x), np.full((4, 2), 3.0))
    scale = fd.differentiable_function(lambda p, n, tag: (p['a'] * n, lambda g: ({'a': g * n}, None, None)), name='scale')
    assert fd.gradient(lambda p: scale(p, 3, 'tag'), {'a': 2.0}) == {'a': 3.0}
    assert fd.gradient(lambda t: affine(Affine(t[0], t[1]), x).sum(), (np.ones((3, 2)), np.zeros(2)))[1].tolist() == [4.0, 4.0]

def test_custom_pullback_may_return_none_for_an_argument():
    ignore_x = fd.differentiable_function(lambda l, x: (x @ l.w, lambda g: (Affine(x.T @ g, None), None)), name='ignore_x')
    layer, x = Affine(np.ones((3, 2)), np.zeros(2)), np.ones((4, 3))
    g_layer, g_x = fd.gradient(lambda l, x: ignore_x(l, x).sum() + x.sum(), layer, x)
    close(g_layer.w, np.full((3, 2), 4.0)); close(g_layer.b, np.zeros(2)); close(g_x, np.ones((4, 3)))

@pytest.mark.parametrize('pullback, message', [
    (lambda x: lambda g: ((x.T @ g,), None), "the cotangent of argument 0 is a tuple, but it should be shaped like the value it belongs to: a Affine"),
    (lambda x: lambda g: (Affine(x.T @ g, g.sum(0)), (g, g)), "the cotangent of argument 1 is a tuple, but it should be shaped like the value it belongs to: a ndarray"),
    (lambda x: lambda g: (Affine(x.T @ g, g.sum(0)),), "returned 1 cotangents for 2 inputs: return a tuple of 2"),
    (lambda x: lambda g: Affine(x.T @ g, g.sum(0)), "returned a Affine for 2 inputs"),
    (lambda x: lambda g: ({'w': x.T @ g},) * 2, "the cotangent of argument 0 is a dict")])
def test_custom_pullback_with_a_cotangent_unlike_its_argument_is_refused(pullback, message):
    bad = fd.differentiable_function(lambda l, x: (x @ l.w + l.b, pullback(x)), name='bad')
    with pytest.raises(DifferentiationError, match=f"pullback of bad:? {message}"):
        fd.gradient(lambda l, x: bad(l, x).sum(), Affine(np.ones((3, 2)), np.zeros(2)), np.ones((4, 3)))

def test_custom_derivative_of_a_model_nests():
    layer, x = Affine(np.ones((3, 2)), np.zeros(2)), np.arange(12.).reshape(4, 3)
    honest = fd.differentiable_function(lambda l, x: (x @ l.w + l.b, lambda g: (Affine(x.T @ g, g.sum(0)), g @ l.w.T)))
    # d/dw of sum(d/dw sum((xw + b)^2)) = d/dw sum(2 x^T (xw + b)) = 2 x^T x summed over the output columns
    h = fd.gradient(lambda l2: fd.gradient(lambda l: (honest(l, x) ** 2).sum(), l2).w.sum(), layer)
    close(h.w, np.repeat((2 * x.T @ x).sum(1, keepdims=True), 2, axis=1))

def test_with_derivative_of_a_structure_is_refused_inside_a_transform():
    with pytest.raises(DifferentiationError, match="with_derivative: x is a tuple, but a hook sees one array's cotangent"):
        fd.gradient(lambda t: fd.with_derivative(t, print)[0], (1.0, 2.0))
    assert fd.with_derivative((1.0, 2.0), print) == (1.0, 2.0)       # outside a transform there is nothing to hook

# --- cotangents are matched by structure, custom pullbacks are checked and run once per sweep ---------------
def test_pullback_matches_dict_cotangents_by_key_and_takes_none_for_zero():
    pb = fd.pullback(lambda a: {'a': 2 * a, 'b': 3 * a}, np.ones(3))
    close(pb({'b': np.full(3, 10.0), 'a': np.ones(3)}), np.full(3, 32.0))
    close(pb({'a': np.ones(3), 'b': None}), np.full(3, 2.0))
    with pytest.raises(DifferentiationError, match=r"the cotangent is a dict with keys \['a', 'c'\], but it should be shaped like the value it belongs to: a dict with keys \['a', 'b'\]"): pb({'a': 1.0, 'c': 1.0})
    with pytest.raises(DifferentiationError, match="the cotangent is a tuple, but it should be shaped like the value it belongs to: a dict"): pb((1.0, 1.0))

def test_custom_pullback_runs_once_per_sweep_and_never_serves_a_stale_result():
    calls = []
    def mul(a, b): return a * b
    mul_fn = fd.differentiable_function(lambda a, b: (a * b, lambda v: (calls.append(1), (v * b, v * a))[1]), name='mul')
    pb = fd.pullback(mul_fn, np.ones(3), np.full(3, 2.0))
    v = np.ones(3)
    g1 = pb(v)
    assert len(calls) == 1                                          # one pullback call serves both inputs
    v *= 10                                                         # the same array, new values
    g2 = pb(v)
    close(g2[0], np.full(3, 20.0)); close(g1[0], np.full(3, 2.0))
    g2[0][:] = 0                                                    # the gradients of two calls share nothing
    close(pb(v)[0], np.full(3, 20.0))

def test_custom_derivative_reaches_traced_keyword_arguments():
    def scaled(x, factor=2.0): return x * factor
    @fd.derivative(of=scaled)
    def scaled_vjp(x, factor=2.0): return x * factor, lambda v: (v * 100, v * x)   # deliberately odd: it must be used
    assert fd.gradient(lambda x: scaled(x=x), 1.0) == 100.0             # by keyword, with the factor defaulted
    assert fd.gradient(lambda x: scaled(x), 1.0) == 100.0                # the pullback's arity never changes
    assert fd.gradient(lambda f: scaled(3.0, factor=f), 1.0) == 3.0

def test_derivative_of_a_numpy_function_the_engine_adapts_and_of_an_operator_ufunc():
    def sum_vjp(x, axis=None, keepdims=False): return np.sum(x), lambda v: v * 7 * np.ones_like(x)
    def add_vjp(a, b): return np.add(a, b), lambda v: (v * 3, v * 5)
    with fd.derivative(of=np.sum, vjp=sum_vjp), fd.derivative(of=np.add, vjp=add_vjp):
        close(fd.gradient(lambda x: np.sum(x), np.ones(2)), [7.0, 7.0])
        close(fd.gradient(lambda x: x.sum(), np.ones(2)), [7.0, 7.0])
        assert fd.gradient(lambda x, y: x + y, 1.0, 2.0) == (3.0, 5.0)             # the operator follows the table
    assert fd.gradient(lambda x, y: x + y, 1.0, 2.0) == (1.0, 1.0)
    close(fd.gradient(lambda x: np.sum(x * x, axis=0), np.ones(2)), [2.0, 2.0])    # the engine's own sum, axis and all

def test_complex_values_are_refused():
    with pytest.raises(DifferentiationError, match=r"argument 0 is a complex number \(complex128\).*real numbers"):
        fd.gradient(lambda z: np.abs(2j * z), np.complex128(1.0))

def test_gradient_of_a_model_valued_function_points_to_pullback():
    with pytest.raises(NonScalarOutputError, match="the result has a Inner, but a gradient needs a scalar"):
        fd.gradient(lambda w: Inner(w * 2), np.ones(2))

# --- the extension points the checkpointing lesson stands on ----------------------------------------------
def make_recomputed(f):
    "f, but its pullback runs f again instead of keeping what f's own pullback would have saved."
    return fd.differentiable_function(lambda *xs: (f(*xs), lambda v: fd.pullback(f, *xs)(v)), name='recomputed')

def test_recomputation_with_a_model_matches_and_reruns(any_backend):
    r = np.random.default_rng(1)
    layer = Affine(to_device(r.standard_normal((3, 2))), to_device(r.standard_normal(2)))
    x = to_device(r.standard_normal((4, 3)))
    runs = []
    def apply_layer(l, x):
        runs.append(1)
        return np.tanh(x @ l.w + l.b)
    plain = fd.gradient(lambda l, x: (apply_layer(l, x) ** 2).sum(), layer, x)
    runs.clear()
    checkpointed = fd.gradient(lambda l, x: (make_recomputed(apply_layer)(l, x) ** 2).sum(), layer, x)
    assert len(runs) == 2                                      # once forward, once again in the backward pass
    close(checkpointed[0].w, plain[0].w); close(checkpointed[0].b, plain[0].b); close(checkpointed[1], plain[1])

@pytest.mark.parametrize('params', [(np.ones(2), np.zeros(2)), [np.ones(2), np.zeros(2)], Pair(np.ones(2), np.zeros(2)),
                                    {'w': np.ones(2), 'b': np.zeros(2)}])
def test_recomputation_with_one_structured_argument(params):
    x = np.array([0.5, -1.0])
    def f(p): return np.tanh(p[0] * x + p[1]) if not isinstance(p, dict) else np.tanh(p['w'] * x + p['b'])
    expected = fd.gradient(lambda p: f(p).sum(), params)
    got = fd.gradient(lambda p: make_recomputed(f)(p).sum(), params)
    assert type(got) is type(params)
    for a, b in zip(flatten(got)[0], flatten(expected)[0]): close(a, b)

def test_custom_functions_may_return_structures():
    x, y = np.array([1.0, 2.0]), np.array([3.0, 4.0, 5.0])
    both = fd.differentiable_function(lambda a, b: ((a * 2, b.sum()), lambda v: (v[0] * 2, v[1] * np.ones_like(b))), name='both')
    assert fd.gradient(lambda a, b: both(a, b)[0].sum() + both(a, b)[1], x, y)[1].tolist() == [1.0, 1.0, 1.0]
    ga, gb = fd.gradient(lambda a, b: both(a, b)[0].sum(), x, y)      # the unused output's cotangent is zeros
    close(ga, [2.0, 2.0]); close(gb, np.zeros(3))
    as_dict = fd.differentiable_function(lambda a: ({'twice': 2 * a, 'sum': a.sum()}, lambda v: 2 * v['twice'] + v['sum']))
    close(fd.gradient(lambda a: as_dict(a)['sum'] + as_dict(a)['twice'][0], x), [3.0, 1.0])
    def pair(a): return np.sin(a), a * a                      # checkpointing a function with two results
    close(fd.gradient(lambda a: (make_recomputed(pair)(a)[0] * make_recomputed(pair)(a)[1]).sum(), x),
          fd.gradient(lambda a: (pair(a)[0] * pair(a)[1]).sum(), x))
    assert both(x, y)[1] == 12.0                              # outside a transform: the plain value

def test_custom_cotangent_shapes_are_checked():
    bad = fd.differentiable_function(lambda z: (z * 2, lambda g: g.sum()), name='bad')
    with pytest.raises(DifferentiationError, match=r"pullback of bad: the cotangent of argument 0 has shape \(\), but the argument has shape \(3,\)"):
        fd.gradient(lambda z: bad(z).sum(), np.ones(3))

def test_custom_derivative_of_a_numpy_function_with_defaults_returns_just_the_one_cotangent():
    def round_vjp(x, decimals=0): return np.round(x, decimals), lambda g: g      # straight-through
    with fd.derivative(of=np.round, vjp=round_vjp):
        for f in (lambda x: np.round(x), lambda x: np.round(x, 0), lambda x: np.round(x, decimals=0)):
            close(fd.gradient(lambda x: f(x).sum(), np.array([0.4, 1.6])), [1.0, 1.0])
    assert fd.registered_derivative(np.round) is None

def test_derivative_of_a_bound_method_is_refused_clearly():
    class Scaler:
        def f(self, x): return x * 3
    with pytest.raises(DifferentiationError, match="`of` is a bound method .*register the function .*Scaler.f itself"):
        fd.derivative(of=Scaler().f)(lambda x: (x, lambda g: g))

def test_unary_primitives_take_their_options_by_keyword():
    A = np.random.default_rng(3).standard_normal((2, 3))
    for call in (lambda: fd.logsumexp(A, 0), lambda: fd.gradient(lambda a: fd.logsumexp(a, 0).sum(), A)):
        with pytest.raises(DifferentiationError, match=r"logsumexp takes one array, and the rest by keyword: logsumexp\(x, axis=0\)"):
            call()
    close(fd.value_with_gradient(lambda a: fd.logsumexp(a, axis=0).sum(), A)[0], np.log(np.exp(A).sum(0)).sum())

def test_none_stands_for_a_whole_part_of_a_cotangent_and_without_derivative_passes_statics():
    pb = fd.pullback(lambda a: {'pair': (a, 2 * a), 'b': 3 * a}, np.ones(2))
    close(pb({'pair': None, 'b': np.ones(2)}), [3.0, 3.0])
    assert fd.gradient(lambda t: fd.without_derivative((t, 3))[0] * 0 + t * 2, 1.0) == 2.0

# --- third review: closures, plain dataclasses, device scalars, checked VJPs ---------------------------------
def test_a_custom_function_closing_over_a_traced_value_is_refused():
    def loss(x, y):
        scale = fd.differentiable_function(lambda a: (a * y, lambda g: g * 3.0), name='scale')
        return scale(x)
    with pytest.raises(DifferentiationError, match="scale: its VJP computed its value from a traced value it was not given"):
        fd.gradient(loss, 2.0, 3.0)
    ok = fd.differentiable_function(lambda a, y: (a * y, lambda g: (g * y, g * a)), name='ok')   # passed in: fine
    assert fd.gradient(lambda x, y: ok(x, y), 2.0, 3.0) == (3.0, 2.0)

def test_without_derivative_looks_inside_plain_dataclasses_and_named_tuples():
    import dataclasses
    @dataclasses.dataclass
    class Box:
        w: object
    assert fd.gradient(lambda x: fd.without_derivative(Box(x * 2)).w + x, 1.0) == 1.0
    assert fd.gradient(lambda x: fd.without_derivative(Pair(x, 3)).a * 5 + x, 1.0) == 1.0

def test_scalar_gradients_and_hook_replacements_on_a_device(strict_backend):
    from fastad.strict import StrictArray
    x32 = to_device(np.array([1.0, 2.0], np.float32))
    g = fd.gradient(lambda s: (x32 * s).mean(), np.float32(2.0))
    assert type(g) is np.float32 and g == np.float32(1.5)
    one = fd.differentiable_function(lambda a: (a * 2, lambda g: 1.0), name='one')      # a Python float cotangent
    g0 = fd.gradient(lambda a: one(a), to_device(np.array(3.0, np.float32)))
    assert type(g0) is StrictArray and g0.dtype == np.float32 and float(g0) == 1.0
    gh = fd.gradient(lambda a: fd.with_derivative(a, lambda g: 0.5).sum(), to_device(np.ones(3)))
    assert type(gh) is StrictArray and to_host(gh).tolist() == [0.5, 0.5, 0.5]

def test_vjps_and_hooks_are_checked():
    with pytest.raises(DifferentiationError, match="a VJP returns \\(value, pullback\\).*Pass the VJP, not the plain function"):
        fd.differentiable_function(lambda a: (np.sin(a), np.cos(a)), name='plain')(np.array([0.3, 0.4]))
    with pytest.raises(DifferentiationError, match="differentiable_function: vjp must be a function"): fd.differentiable_function(3)
    two = fd.differentiable_function(lambda a, b: (a * b, lambda g: (g * b, g * a)), name='two')
    with pytest.raises(DifferentiationError, match=r"two: these arguments do not fit its VJP \(a, b\): too many positional arguments"): two(1.0, 2.0, 3.0)
    with pytest.raises(DifferentiationError, match=r"with_derivative: the hook returned shape \(3,\) for a cotangent of shape \(2,\)"):
        fd.gradient(lambda a: fd.with_derivative(a, lambda g: np.ones(3)).sum(), np.ones(2))


def _central(f, x, eps=1e-6):
    "Central differences of f at vector x: f's shape, then x's."
    columns = []
    for i in range(len(x)):
        up, down = x.copy(), x.copy()
        up[i] += eps; down[i] -= eps
        columns.append((np.asarray(f(up)) - np.asarray(f(down))) / (2 * eps))
    return np.stack(columns, axis=-1)

def _triple_in_place(g): g *= 3                          # the docstring allows it: None returned, g changed
def _triple_returned(g): return g * 3

@pytest.mark.parametrize('hook', [_triple_in_place, _triple_returned])
def test_a_hook_that_changes_g_in_place_counts_in_every_higher_order(hook):
    def f(x):
        y = fd.with_derivative(x * x, hook)              # the derivative through y is tripled
        return (np.sin(y) * np.cos(x)).sum()
    def tripled(x):                                       # what f's gradient is, written out: a plain function
        return 3 * np.cos(x * x) * 2 * x * np.cos(x) - np.sin(x * x) * np.sin(x)
    x, t = np.array([0.3, -1.2, 2.0]), np.array([1., 2., -1.])
    grad = fd.gradient(f, x)
    np.testing.assert_allclose(grad, tripled(x), rtol=1e-9)
    hessian = np.diag(_central(tripled, x).diagonal())   # tripled is elementwise: its Jacobian is diagonal
    np.testing.assert_allclose(fd.hessian(f, x), hessian, rtol=1e-6, atol=1e-6)   # before (in place): [-0.591, ...]
    np.testing.assert_allclose(fd.jacobian(fd.gradient(f), x), hessian, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fd.differential(f, x)(t), grad @ t, rtol=1e-9)   # before (in place): 3.776, not 11.33
    def g(x):                                             # more outputs than inputs: the Jacobian by columns
        y = fd.with_derivative(x * x, hook)
        return np.stack([np.sin(y).sum(), (y * x).sum(), np.cos(y[0])])
    def g_tripled(x):                                     # g's Jacobian, the derivative through y tripled
        dy = 3 * 2 * x
        return np.stack([np.cos(x * x) * dy, dy * x + x * x, -np.sin(x[0] ** 2) * dy[0] * np.eye(2)[0]])
    x2 = np.array([0.7, -0.4])
    np.testing.assert_allclose(fd.jacobian(g, x2), g_tripled(x2), rtol=1e-9)
    rows = np.stack([fd.gradient(lambda x: g(x)[i], x2) for i in range(3)])      # by rows, one pullback each
    np.testing.assert_allclose(rows, g_tripled(x2), rtol=1e-9)
