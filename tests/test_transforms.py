"""The transforms on structures, their error paths, and the custom-derivative API: custom rules at every trace level,
closures refused, models rebuilt through their constructor, registrations a user can see and undo, one structure
walker, and the cotangents a custom pullback gets (private, of the result's dtype, one per input) and what it keeps."""
import warnings
from collections import namedtuple
import numpy as np, pytest
import fastad as fd
from fastad.primitives import REGISTRY
from fastad.errors import DifferentiationError, NonScalarOutputError, NoDerivativeError
from fastad.backend import to_device, to_host
from fastad.tree import flatten

def close(a, b, **kw): np.testing.assert_allclose(to_host(a), to_host(b), **({'rtol': 1e-9, 'atol': 1e-12} | kw))
Pair = namedtuple('Pair', 'a b')

# --- structures ---------------------------------------------------------------------------------------

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
import dataclasses, inspect, sys, threading, traceback
from collections import OrderedDict, defaultdict
from fastad.tree import map_structure, is_container
from fastad.tree import stores_its_fields
import gc
from fastad.primitives import Primitive
import tracemalloc
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


from engine_helpers import numerical_jacobian as _central

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


# --- a custom rule is what gets differentiated, at every trace level ----------------------------------
def safe_log_vjp(x): return np.log(x), lambda g: g / np.maximum(x, 1e-3)
safe_log = fd.differentiable_function(safe_log_vjp, name='safe_log')

def test_custom_rule_is_used_at_the_outer_level_of_mixed_arguments():
    # the value of the inner transform, differentiated by the outer one: the rule says 1 / max(a, 1e-3)
    got = fd.gradient(lambda a: fd.value_with_gradient(lambda z: safe_log(a + z), 0.0)[0], 1e-6)
    close(got, 1e3)

def test_registered_rule_is_used_at_the_outer_level_of_mixed_arguments():
    def guarded_log(x): return np.log(x)
    with fd.derivative(of=guarded_log, vjp=lambda x: (guarded_log(x), lambda g: g / np.maximum(x, 1e-3))):
        close(fd.gradient(lambda a: fd.value_with_gradient(lambda z: guarded_log(a + z), 0.0)[0], 1e-6), 1e3)

def test_custom_rule_at_second_order_with_mixed_levels():
    # inner gradient: 2 safe_log(x) rule(x); its derivative in a: 2 rule(x)^2 + 2 safe_log(x) rule'(x), rule' = 0 below 1e-3
    got = fd.gradient(lambda a: fd.gradient(lambda z: safe_log(a + z) * safe_log(a + z), 0.0), 1e-6)
    close(got, 2e6)
    close(fd.gradient(lambda a: fd.gradient(lambda z: safe_log(a + z), 0.0), 2.0), -0.25)   # the rule's own derivative
    close(fd.gradient(fd.gradient(safe_log))(2.0), -0.25)
    close(fd.gradient(fd.gradient(fd.gradient(safe_log)))(2.0), 2 / 8)

def test_custom_rule_with_two_arguments_on_different_levels():
    calls = []
    def scaled_vjp(x, y):
        calls.append(1)
        return x * y, lambda g: (g * y * 10, g * x * 10)                 # deliberately 10x: it must be used
    scaled = fd.differentiable_function(scaled_vjp, name='scaled')
    got = fd.gradient(lambda a: fd.value_with_gradient(lambda z: scaled(a, z), 3.0)[0], 2.0)
    close(got, 30.0)                                                     # d/da of the rule's value a * z: 10 z

def test_custom_rule_with_structured_arguments_on_mixed_levels():
    class Lin(fd.Differentiable):
        w: np.ndarray
    def lin_vjp(m, x): return (m.w * x).sum(), lambda g: (Lin(g * x * 10), g * m.w)   # w's cotangent 10x: must be used
    lin = fd.differentiable_function(lin_vjp, name='lin')
    x = np.array([1.0, 2.0])
    got = fd.gradient(lambda m: fd.value_with_gradient(lambda z: lin(m, z), x)[0], Lin(np.ones(2)))
    close(got.w, 10 * x)
    pair = fd.differentiable_function(lambda a: ((a * 2, a * 3), lambda g: g[0] * 20 + g[1] * 30), name='pair')
    close(fd.gradient(lambda a: fd.value_with_gradient(lambda z: pair(a + z)[1], 0.0)[0], 1.0), 30.0)

# --- a VJP whose value comes from a traced value it was not given is refused ------------------------------
def test_closure_over_a_traced_value_with_plain_arguments_is_refused():
    def loss(x): return fd.differentiable_function(lambda y: (x * y, lambda g: 0 * g), name='closes')(2.0)
    with pytest.raises(DifferentiationError, match="closes: its VJP computed its value from a traced value it was not given"):
        fd.gradient(loss, 3.0)

def test_closure_over_an_outer_traced_value_is_refused():
    def loss(x):
        f = fd.differentiable_function(lambda y: (x * y, lambda g: g * x), name='closes')
        return fd.gradient(lambda y: f(y), 2.0)
    with pytest.raises(DifferentiationError, match="closes: its VJP computed its value from a traced value"):
        fd.gradient(loss, 3.0)

def test_closure_over_a_traced_value_through_a_registered_forward_is_refused():
    def loss(x):
        def scaled(y): return x * y
        with fd.derivative(of=scaled, vjp=lambda y: (scaled(y), lambda g: 0 * g)): return scaled(2.0)
    with pytest.raises(DifferentiationError, match="scaled: its VJP computed its value from a traced value"):
        fd.gradient(loss, 3.0)

# --- models are rebuilt through their constructor; frozen models work -----------------------------------
class Cached(fd.Differentiable):
    w: np.ndarray
    cache: np.ndarray = dataclasses.field(init=False)
    def __post_init__(self): self.cache = self.w * 2

def test_a_field_derived_in_post_init_is_recomputed_from_traced_values():
    m = Cached(np.array([1.0, 2.0]))
    g = fd.gradient(lambda m: (m.cache * m.w).sum(), m)                 # sum(2 w^2): 4 w
    assert type(g) is Cached
    close(g.w, [4.0, 8.0])
    assert g.cache is None               # a gradient runs no model code, and the model's derived field is no gradient

@dataclasses.dataclass(frozen=True)
class Frozen(fd.Differentiable):
    w: np.ndarray
    b: float = 0.5
    tag: str = fd.nondifferentiable(default='frozen')

def test_frozen_models_can_be_built_differentiated_and_rebuilt():
    m = Frozen(np.array([1.0, 2.0]))
    with pytest.raises(dataclasses.FrozenInstanceError): m.w = None
    g = fd.gradient(lambda m: (m.w * m.b).sum(), m)
    assert type(g) is Frozen and g.tag == 'frozen'
    close(g.w, [0.5, 0.5]); close(g.b, 3.0)
    stopped = fd.without_derivative(m)
    assert type(stopped) is Frozen and stopped.tag == 'frozen'
    assert [f.name for f in dataclasses.fields(Frozen) if f.metadata.get('differentiable', True)] == ['w', 'b']

def test_an_explicit_dataclass_decorator_keeps_nondifferentiable_fields():
    @dataclasses.dataclass
    class Plain(fd.Differentiable):
        w: float
        scale: float = fd.nondifferentiable(default=3.0)
        seen: list = dataclasses.field(default_factory=list)
    g = fd.gradient(lambda m: m.w * m.scale, Plain(2.0))
    assert g.w == 3.0 and g.scale == 3.0 and g.seen == []

def test_subclasses_of_models_inherit_fields():
    class Base(fd.Differentiable):
        w: float
    class Child(Base):
        v: float = 1.0
    g = fd.gradient(lambda m: m.w * m.v * 3, Child(2.0, 5.0))
    assert type(g) is Child and (g.w, g.v) == (15.0, 6.0)
    assert Base(1.0).w == 1.0 and [f.name for f in dataclasses.fields(Child)] == ['w', 'v']

# --- models rebuilt by setting their fields, only where the constructor does nothing more --------------------

class Counted(fd.Differentiable):
    "A model with an __init__ of its own that counts its calls."
    w: np.ndarray
    calls = []
    def __init__(self, w):
        Counted.calls.append(1)
        object.__setattr__(self, 'w', w)

@stores_its_fields
class CountedStoring(Counted):
    v: float = 1.0
    def __init__(self, w, v=1.0):
        CountedStoring.calls.append(1)
        object.__setattr__(self, 'w', w); object.__setattr__(self, 'v', v)

def test_a_model_whose_constructor_only_stores_its_fields_is_rebuilt_without_calling_it():
    m = CountedStoring(np.array([1.0, 2.0]), 3.0)
    CountedStoring.calls.clear()
    g = fd.gradient(lambda m: (m.w * m.v).sum(), m)
    assert type(g) is CountedStoring and CountedStoring.calls == []     # neither the traced copy nor the gradient called it
    close(g.w, [3.0, 3.0]); close(g.v, 3.0)

def test_a_model_with_its_own_constructor_is_still_rebuilt_through_it():
    m = Counted(np.array([1.0, 2.0]))
    Counted.calls.clear()
    g = fd.gradient(lambda m: (m.w ** 2).sum(), m)
    assert type(g) is Counted and len(Counted.calls) == 1                # the traced copy (a gradient runs no model code)
    close(g.w, [2.0, 4.0])

def test_a_subclass_of_a_storing_model_with_a_post_init_gets_it_run():
    class Derived(CountedStoring):
        twice: np.ndarray = dataclasses.field(init=False, default=None)
        def __post_init__(self): object.__setattr__(self, 'twice', self.w * 2)
    m = Derived(np.array([1.0, 2.0]))
    g = fd.gradient(lambda m: (m.twice * m.w).sum(), m)                # sum(2 w^2): 4 w
    close(g.w, [4.0, 8.0]); assert g.twice is None                    # a gradient runs no model code, nor carries the model's

def test_a_model_with_its_own_setattr_sees_every_rebuild():
    seen = []
    class Watched(fd.Differentiable):
        w: float
        def __setattr__(self, name, value):
            seen.append(name)
            object.__setattr__(self, name, value)
    g = fd.gradient(lambda m: m.w * 3.0, Watched(2.0))
    assert g.w == 3.0 and seen == ['w', 'w']                           # built, traced copy (a gradient runs no model code)

def test_labels_in_errors_name_the_path_to_the_item():
    with pytest.raises(DifferentiationError, match=r"argument 1\[1\] is a str"): flatten((1.0, [2.0, 'x']), arguments=True)
    with pytest.raises(DifferentiationError, match=r"argument\['k'\]\[0\]\[1\] is a NoneType"): flatten({'k': [(1.0, None)]})

# --- the custom pullbacks' memo belongs to each thread ---------------------------------------------------
def test_custom_pullbacks_of_one_function_in_four_threads():
    def mul_vjp(a, b): return a * b, lambda g: (g * b, g * a)
    mul = fd.differentiable_function(mul_vjp, name='mul')
    pb = fd.pullback(lambda a, b: mul(a, b) + mul(b, a), np.ones(3), np.full(3, 2.0))
    errors, old = [], sys.getswitchinterval()
    def work(k):
        try:
            for _ in range(3000):
                ga, gb = pb(np.full(3, float(k)))
                if not (np.all(ga == 4.0 * k) and np.all(gb == 2.0 * k)): errors.append((k, ga, gb))
        except Exception as e: errors.append(e)
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
        for t in threads: t.start()
        for t in threads: t.join()
    finally: sys.setswitchinterval(old)
    assert errors == []

# --- one walker -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Box:
    content: object
    label: str = 'box'

class Model(fd.Differentiable):
    w: np.ndarray
    name: str = fd.nondifferentiable(default='m')

def test_map_structure_walks_every_container_and_keeps_its_type():
    d = defaultdict(list, {'k': 1.0})
    x = {'t': (1.0, [2.0, Pair(3.0, 4.0)]), 'o': OrderedDict(z=5.0), 'd': d, 'box': Box(6.0),
         'm': Model(np.ones(2)), 'f': Frozen(np.ones(1))}
    y = map_structure(lambda v: v * 10 if isinstance(v, (float, np.ndarray)) else v, x)
    assert type(y['t']) is tuple and type(y['t'][1]) is list and type(y['t'][1][1]) is Pair
    assert y['t'][1][1] == Pair(30.0, 40.0) and y['t'][0] == 10.0
    assert type(y['o']) is OrderedDict and y['o']['z'] == 50.0
    assert type(y['d']) is defaultdict and y['d']['k'] == 10.0 and y['d']['missing'] == []   # keeps its factory
    assert type(y['box']) is Box and y['box'].content == 60.0 and y['box'].label == 'box'
    assert type(y['m']) is Model and y['m'].name == 'm'
    close(y['m'].w, [10.0, 10.0]); close(y['f'].w, [10.0]); assert y['f'].b == 5.0
    assert x['t'][0] == 1.0 and x['box'].content == 6.0                      # the input is untouched
    assert all(is_container(v) for v in x.values()) and not is_container(np.ones(2)) and not is_container(Box)

def test_flatten_and_without_derivative_agree_with_the_walker():
    x = (Box(np.ones(2)), {'m': Model(np.ones(2))}, [Pair(1.0, 2.0)])
    leaves, rebuild = flatten(x)
    assert len(leaves) == 4
    back = rebuild([l * 2 for l in leaves])
    assert type(back[0]) is Box and type(back[1]['m']) is Model and type(back[2][0]) is Pair
    g = fd.gradient(lambda t: fd.without_derivative(t)[0].content.sum() + t[2][0].a * 3, x)
    close(g[0].content, [0.0, 0.0]); assert g[2][0].a == 3.0

def test_tree_imports_nothing_above_errors():
    import ast, fastad.tree
    module = ast.parse(inspect.getsource(fastad.tree))
    from_fastad = [n.module for n in module.body if isinstance(n, ast.ImportFrom) and (n.level or n.module.startswith('fastad'))]
    assert from_fastad == ['errors'], from_fastad                      # the backend can import the walker

# --- registrations a user can see and undo ---------------------------------------------------------------
def lopsided(x):
    "Doubles x."
    return 2 * x

def test_a_registration_can_be_undone_and_stacks():
    assert fd.registered_derivative(lopsided) is None
    @fd.derivative(of=lopsided)
    def lopsided_vjp(x): return lopsided(x), lambda g: g * 100
    assert lopsided_vjp.__name__ == 'lopsided_vjp'                     # the decorator returns the VJP
    first = fd.registered_derivative(lopsided)
    assert first.vjp is lopsided_vjp and first.of is lopsided and 'lopsided' in repr(first)
    assert fd.gradient(lopsided, 1.0) == 100.0
    second = fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 7))   # again: the last one wins
    assert fd.gradient(lopsided, 1.0) == 7.0 and fd.registered_derivative(lopsided) is second
    second.undo()
    assert fd.gradient(lopsided, 1.0) == 100.0                           # undoing the later restores the earlier
    second.undo()                                                        # a second undo does nothing
    first.undo()
    assert fd.gradient(lopsided, 1.0) == 2.0 and fd.registered_derivative(lopsided) is None
    assert lopsided(3.0) == 6.0

def test_undo_of_an_earlier_registration_keeps_the_later_in_force():
    first = fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 100))
    second = fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 7))
    first.undo()
    assert fd.gradient(lopsided, 1.0) == 7.0
    second.undo()
    assert fd.gradient(lopsided, 1.0) == 2.0

def test_the_context_manager_form():
    with fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 100)) as reg:
        assert fd.gradient(lopsided, 1.0) == 100.0 and reg.active
    assert fd.gradient(lopsided, 1.0) == 2.0 and not reg.active

def test_a_registered_function_keeps_its_source_help_and_tracebacks():
    source, signature, doc = inspect.getsource(lopsided), inspect.signature(lopsided), lopsided.__doc__
    with fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g)):
        assert inspect.getsource(lopsided) == source and inspect.signature(lopsided) == signature
        assert lopsided.__doc__ == doc and lopsided.__name__ == 'lopsided'
        assert 'Doubles x.' in fd.__class__.__name__ + __import__('pydoc').render_doc(lopsided)
        with pytest.raises(TypeError) as info: lopsided('a', 'b')
        files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
        assert '<string>' not in files and all(f.endswith('.py') for f in files)
        names = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert 'trampoline' not in names and 'lopsided' in names
    assert inspect.getsource(lopsided) == source

def test_tracebacks_through_a_registered_function_show_the_users_file():
    def fails(x): raise ValueError("from the user's code")
    with fd.derivative(of=fails, vjp=lambda x: (fails(x), lambda g: g)):
        with pytest.raises(ValueError) as info: fails(1.0)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename == __file__ and frames[-1].name == 'fails'
    assert all(f.filename != '<string>' for f in frames)

def test_numpy_registrations_are_undone():
    close(fd.gradient(lambda x: np.cbrt(x).sum(), np.ones(2)), [1 / 3, 1 / 3])                 # fastad's own rule
    with fd.derivative(of=np.cbrt, vjp=lambda x: (np.cbrt(x), lambda g: g * 5)):
        close(fd.gradient(lambda x: np.cbrt(x).sum(), np.ones(2)), [5.0, 5.0])
        with fd.derivative(of=np.add, vjp=lambda a, b: (np.add(a, b), lambda g: (g * 3, g * 5))):
            assert fd.gradient(lambda x, y: x + y, 1.0, 2.0) == (3.0, 5.0)             # the operator follows
        with fd.derivative(of=np.sum, vjp=lambda x, axis=None, keepdims=False: (np.sum(x), lambda g: g * 7 * np.ones_like(x))):
            close(fd.gradient(lambda x: x.sum(), np.ones(2)), [7.0, 7.0])
    assert fd.gradient(lambda x, y: x + y, 1.0, 2.0) == (1.0, 1.0)
    close(fd.gradient(lambda x: x.sum(axis=0), np.ones(2)), [1.0, 1.0])                   # the engine's own sum again
    close(fd.gradient(lambda x: np.cbrt(x).sum(), np.ones(2)), [1 / 3, 1 / 3])                 # and its own cbrt

def test_registration_errors_are_clear():
    with pytest.raises(DifferentiationError, match="derivative: `of` must be a function, not a float"): fd.derivative(of=3.0)
    with pytest.raises(DifferentiationError, match="derivative: vjp must be a function"): fd.derivative(of=lopsided, vjp=3)
    import math
    with pytest.raises(DifferentiationError, match="derivative: cannot reach every call of exp"):
        fd.derivative(of=math.exp, vjp=lambda x: (math.exp(x), lambda g: g * math.exp(x)))
    def one(x): return x * 3.0
    with fd.derivative(of=one, vjp=lambda x, y: (x * y, lambda g: (g, g))):
        with pytest.raises(DifferentiationError, match=r"one: these arguments do not fit its VJP \(x, y\): missing a required argument: 'y'"):
            fd.gradient(one, 1.0)
    with fd.derivative(of=one, vjp=lambda x: (x * 3.0, lambda: 1.0)):
        with pytest.raises(DifferentiationError, match="one: its pullback must take one argument, the cotangent"):
            fd.gradient(one, 1.0)
    assert one(2.0) == 6.0

class Sized(fd.Differentiable):
    w: np.ndarray
    def __init__(self, n): object.__setattr__(self, 'w', np.ones(n))      # an __init__ that does not take the field

def test_a_model_whose_init_does_not_take_its_fields_is_copied_field_by_field():
    g = fd.gradient(lambda m: (m.w * 3).sum(), Sized(2))
    assert type(g) is Sized
    close(g.w, [3.0, 3.0])

def test_map_structure_with_unbox_strips_every_level():
    from fastad.engine import unbox
    def inner(m): 
        plain = map_structure(unbox, {'m': m, 't': (m.w, 2)})
        assert type(plain['m']) is Model and type(plain['m'].w) is np.ndarray and plain['t'][1] == 2
        return (m.w ** 2).sum()
    close(fd.gradient(lambda m: fd.gradient(inner, m).w.sum(), Model(np.ones(2))).w, [2.0, 2.0])

# --- value_with_gradient frees its tape as the sweep runs ----------------------------------------------------
def test_value_with_gradient_consumes_its_tape_but_pullbacks_stay_reusable():
    import fastad.transforms as T
    traces = []
    real = T.Recording
    class Spy(real):
        def __init__(self):
            super().__init__()
            traces.append(self)
    T.Recording = Spy
    try:
        assert fd.value_with_gradient(lambda x: np.sin(x) * x, 1.0)[1] == pytest.approx(np.cos(1.0) + np.sin(1.0))
        pb = fd.pullback(lambda x: np.sin(x) * x, 1.0)
        assert pb(1.0) == pb(1.0)                                          # a pullback you hold runs many times
    finally: T.Recording = real
    assert all(entry is None for entry in traces[0].tape)                 # every entry dropped once it had run
    assert any(entry is not None for entry in traces[1].tape)


# ---- a pullback serving several inputs gives exactly one cotangent per input ---------------------------------------
# A pullback serving several inputs at once gives exactly one cotangent per input


def test_a_pullback_for_two_inputs_returning_one_array_is_refused():
    f = Primitive('times_one_array', lambda x, y: (x * y, lambda g: g * y))
    x, y = np.array([1., 2., 3.]), np.array([4., 5., 6.])
    with pytest.raises(DifferentiationError, match=r"times_one_array.*exactly 2 cotangents"):
        fd.gradient(lambda x, y: (f(x, y) * np.array([1., 2., 3.])).sum(), x, y)   # zip walked the array

def test_a_pullback_for_two_inputs_returning_one_cotangent_is_refused():
    f = Primitive('times_one_cotangent', lambda x, y: (x * y, lambda g: (g * y,)))
    with pytest.raises(DifferentiationError, match=r"times_one_cotangent.*exactly 2 cotangents.*returned 1"):
        fd.gradient(lambda x, y: f(x, y).sum(), np.ones(3), np.ones(3))            # y's gradient silently zero

def test_a_pullback_for_two_inputs_returning_two_cotangents_works():
    f = Primitive('times', lambda x, y: (x * y, lambda g: [g * y, None]))
    x, y = np.array([1., 2., 3.]), np.array([4., 5., 6.])
    gx, gy = fd.gradient(lambda x, y: (f(x, y) * np.array([1., 2., 3.])).sum(), x, y)
    np.testing.assert_allclose(gx, [4., 10., 18.]); np.testing.assert_allclose(gy, 0.)


# --- custom derivatives and trace levels ----------------------------------------------------------------------------

def test_custom_derivative_with_an_argument_of_two_trace_levels():
    safe_log = fd.differentiable_function(safe_log_vjp)
    g = fd.gradient(lambda a: fd.value_with_gradient(lambda z: safe_log(a + z), 0.0)[0], 1e-6)
    close(g, 1e3)                                                  # the rule's 1 / max(x, 1e-3), not 1 / x = 1e6

def test_registered_derivative_with_an_argument_of_two_trace_levels():
    def safe_log(x): return np.log(x)
    fd.derivative(of=safe_log)(safe_log_vjp)
    close(fd.gradient(lambda a: fd.value_with_gradient(lambda z: safe_log(a + z), 0.0)[0], 1e-6), 1e3)

def test_custom_vjp_closing_over_a_traced_value_with_constant_arguments():
    def f(x): return fd.differentiable_function(lambda y: (x * y, lambda g: 0 * g))(2.0)
    with pytest.raises(DifferentiationError): fd.gradient(f, 3.0)


# --- cotangents are not shared mutable state -------------------------------------------------------------

def _tripled_in_place():
    def vjp(x):
        def pb(g):
            g *= 3                                      # writes into the cotangent it was given
            return g
        return x, pb
    return fd.differentiable_function(vjp, name='tripled')

def _tripled():
    return fd.differentiable_function(lambda x: (x, lambda g: g * 3), name='tripled')

def test_a_pullback_writing_its_cotangent_cannot_change_a_sibling_branch():
    x, v = np.array([0.5, 1.0]), np.ones(2)
    f = lambda x: _tripled_in_place()(np.sin(x)) + np.sin(x) + 3
    with pytest.raises(DifferentiationError, match=r"tripled: .*read-only.*copy it first"):
        fd.pullback(f, x)(v)                            # before: 3 cos x + 3 cos x, silently (the sibling saw g * 3)
    test = fd.pullback(lambda x: _tripled()(np.sin(x)) + np.sin(x) + 3, x)(v)
    np.testing.assert_allclose(test, 4 * np.cos(x))     # 3 cos x from the custom branch, cos x from the sibling

def test_a_pullback_writing_its_cotangent_leaves_the_callers_array_alone():
    x, v = np.array([0.5, 1.0]), np.ones(2)
    with pytest.raises(DifferentiationError, match="read-only"):
        fd.pullback(lambda x: _tripled_in_place()(x), x)(v)     # before: returned [3, 3] and v became [3, 3]
    np.testing.assert_array_equal(v, [1, 1])

def test_a_pullback_writing_a_broadcast_cotangent_gets_a_fastad_error_not_numpys():
    x = np.array([0.5, 1.0])
    with pytest.raises(DifferentiationError, match="g = g.copy()"):    # before: NumPy's ValueError, output array is read-only
        fd.gradient(lambda x: (_tripled_in_place()(x.sum(0, keepdims=True) * np.ones(3))).sum(), x)

def test_a_custom_pullbacks_cotangent_is_read_only_but_the_caller_keeps_a_writable_array():
    seen = []
    f = fd.differentiable_function(lambda x: (x * 2, lambda g: (seen.append(g), g * 2)[1]), name='double')
    v = np.ones(3)
    np.testing.assert_array_equal(fd.pullback(f, np.zeros(3))(v), [2, 2, 2])
    assert not seen[-1].flags.writeable and v.flags.writeable

# --- cotangent types -------------------------------------------------------------------------------------

def test_a_python_float_cotangent_for_a_float64_scalar_result_is_cast():
    A = np.array([[2., 1.], [1., 3.]])
    np.testing.assert_allclose(fd.value_with_pullback(np.linalg.det, A)[1](1.0), [[3, -1], [-1, 2]])  # before: TypeError

@pytest.mark.parametrize("x, cotangent, dtype", [
    (np.float64(1.0), 1.0, np.float64), (1.0, 1.0, np.float64), (np.ones(2, np.float32), np.ones(2), np.float32),
    (np.float32(1.0), 1.0, np.float32), (np.ones((), np.float32), np.float64(1.0), np.float32)])
def test_a_custom_pullback_receives_a_numpy_value_of_the_results_dtype(x, cotangent, dtype):
    seen = []
    double = fd.differentiable_function(lambda x: (x * 2, lambda g: (seen.append(g), g * 2)[1]), name='double')
    fd.pullback(lambda x: double(x), x)(cotangent)
    assert isinstance(seen[-1], (np.ndarray, np.generic)) and seen[-1].dtype == dtype, (type(seen[-1]), seen[-1])

# --- np.matrix cotangents and inputs ----------------------------------------------------------------------

@pytest.mark.filterwarnings('ignore::PendingDeprecationWarning')   # np.matrix, on purpose
def test_an_np_matrix_cotangent_is_an_array_at_the_door():
    x = np.array([[1., 2.], [3., 4.]])
    got = fd.pullback(lambda x: x * x, x)(np.matrix(np.ones((2, 2))))
    assert type(got) is np.ndarray
    np.testing.assert_allclose(got, 2 * x)              # before: [[8, 12], [8, 12]], matrix products
    got = fd.pullback(lambda x: np.sin(x) * x, x)(np.matrix(np.ones((2, 2))))
    np.testing.assert_allclose(got, np.cos(x) * x + np.sin(x))

@pytest.mark.filterwarnings('ignore::PendingDeprecationWarning')   # np.matrix, on purpose
def test_an_np_matrix_from_a_custom_pullback_becomes_an_array():
    seen = []
    colsum = fd.differentiable_function(                 # SciPy's sparse reductions hand back an np.matrix
        lambda x: (x * 1, lambda g: (seen.append(type(g)), np.matrix(g))[1]), name='as_matrix')
    x = np.array([[1., 2.], [3., 4.]])
    got = fd.gradient(lambda x: colsum(x * x).sum(), x)  # the matrix meets x * x's chain: g * x
    assert type(got) is np.ndarray and seen == [np.ndarray]
    np.testing.assert_allclose(got, 2 * x)              # before: [[8, 12], [8, 12]], a matrix product

@pytest.mark.filterwarnings('ignore::PendingDeprecationWarning')   # np.matrix, on purpose
def test_an_np_matrix_input_is_a_fastad_error():
    with pytest.raises(DifferentiationError, match=r"argument 0 is a numpy.matrix.*numpy.asarray"):   # before: keepdims TypeError
        fd.gradient(lambda x: (x * x).sum(), np.matrix([[1., 2.], [3., 4.]]))

# --- what a pullback keeps alive ----------------------------------------------------------------------------

N = 1_000_000                                            # 8 MB of float64

def _held(make):
    "Bytes the pullback `make()` returns keeps alive, measured with tracemalloc, and the same after calling it once."
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        pb = make()
        built = tracemalloc.get_traced_memory()[0] - start
        pb(1.0)
        gc.collect()
        called = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return built, called

def test_a_custom_functions_pullback_does_not_keep_its_output():
    x = np.ones(N)
    double = fd.differentiable_function(lambda x: (x * 2, lambda g: g * 2), name='double')
    plain, _ = _held(lambda: fd.pullback(lambda x: (x * 2).sum(), x))
    custom, _ = _held(lambda: fd.pullback(lambda x: double(x).sum(), x))
    assert plain < 64_000                                # about 2 KB
    assert custom < plain + 64_000, (plain, custom)      # before: 8 MB more, the custom function's own output

def test_a_registered_derivatives_pullback_does_not_keep_its_output():
    def doubled(x): return x * 2
    x = np.ones(N)
    with fd.derivative(of=doubled, vjp=lambda x: (x * 2, lambda g: g * 2)):
        custom, _ = _held(lambda: fd.pullback(lambda x: doubled(x).sum(), x))
    plain, _ = _held(lambda: fd.pullback(lambda x: (x * 2).sum(), x))
    assert custom < plain + 64_000, (plain, custom)

def test_a_called_pullback_does_not_keep_a_constants_cotangent():
    x, c = np.ones(N), np.full(N, 2.0)
    times = fd.differentiable_function(lambda x, c: (x * c, lambda g: (g * c, g * x)), name='times')
    _, plain = _held(lambda: fd.pullback(lambda x: (x * c).sum(), x))
    _, custom = _held(lambda: fd.pullback(lambda x: times(x, c).sum(), x))
    assert custom < plain + 64_000, (plain, custom)      # before: 8 MB more, c's cotangent in a per-thread cache

def test_a_custom_function_still_gives_every_traced_input_its_cotangent():
    times = fd.differentiable_function(lambda x, c: (x * c, lambda g: (g * c, g * x)), name='times')
    x, c = np.array([1., 2.]), np.array([3., 4.])
    gx, gc_ = fd.gradient(lambda x, c: times(x, c).sum(), x, c)
    np.testing.assert_array_equal(gx, c); np.testing.assert_array_equal(gc_, x)
    pb = fd.pullback(lambda x: times(x, c).sum(), x)
    for _ in range(2): np.testing.assert_array_equal(pb(1.0), c)     # called again: the pullback runs again
