"""Properties of every differentiable operation fastad registers, and of random programs built from them.

`SPECS` below is the table: one generator spec per entry point (a NumPy ufunc or function the engine
routes, a method or operator of the traced value, a function fastad exports). Each spec says which entry
points it reaches, how its inputs are drawn (domain, shapes, axes and keywords) and, in `note`, why its
domain is what it is. `test_every_entry_point_has_a_spec` fails, listing what is missing, the moment a
primitive, an adapter or a traced method is added without one. A rule carries its own domain (`defvwc(domain=...)`):
the specs of the ufuncs, reductions and scans are derived from the registry (`derived_specs`), and
`test_every_rule_has_a_domain_its_tests_draw_from` names a rule that has none.

For every spec, hypothesis draws shapes (size-0 and size-1 axes, broadcasting), keywords and values, then
checks, under each backend (`any_backend`: numpy, and strict, which refuses silent host copies):
  * the value equals the plain call of the same function on plain arrays;
  * the pullback of a random cotangent `v`, dotted with a random direction `d`, equals the central
    difference of <v, f(x + t d)> at t = +-1e-6 (float64), within 1e-6 relative to max(1, |estimate|):
    the truncation error of central differences is ~eps^2 |f'''| and the rounding error ~1e-16 |f| / eps,
    both far below that on inputs of magnitude <= 3;
  * calling the pullback twice gives identical gradients, and leaves the caller's cotangent unchanged;
  * gradients keep their argument's shape, dtype and array type.
Second order (the pullback differentiated again), float32 in / float32 out and Python floats in / floats
out are checked on the same table. Inputs stay away from kinks (abs, maximum, minimum, clip, relu, mod,
max/min ties) by more than 1e-6, so central differences never straddle one.
"""
import dataclasses, importlib, pkgutil, warnings
from typing import Callable
import numpy as np, pytest
from hypothesis import given, settings, assume, strategies as st, HealthCheck
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes, broadcastable_shapes, valid_tuple_axes
import fastad as fd
import fastad.primitives as P
import fastad.primitives_more as PM
from fastad import engine
from fastad.backend import to_device, to_host, array_module, np2, numpy_function, get_backend, use_backend, gpu_available
from fastad.errors import FastADError, DifferentiationError

EPS, RTOL = 1e-6, 1e-6                        # central-difference step and tolerance (float64)
SECOND_RTOL = 1e-5                            # second order: differences of an analytic first derivative
CHECKS = dict(deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.filter_too_much, HealthCheck.data_too_large])

# --- values: each kind keeps central differences reliable -------------------------------------------------
def _sign(r, shape): return np.where(r.random(shape) < 0.5, -1.0, 1.0)

KINDS = {
    'real': lambda r, s: r.uniform(-2, 2, s),
    'positive': lambda r, s: r.uniform(0.5, 2, s),                            # log, sqrt, bases of powers
    'away0': lambda r, s: _sign(r, s) * r.uniform(0.25, 2, s),                # abs, relu, divisors: no kink at 0
    'unit': lambda r, s: r.uniform(-1, 1, s),                                  # tan: far from its poles
    'log1p': lambda r, s: r.uniform(-0.5, 2, s),
    # ties-free: distinct values at least 0.08 apart, for max/min reductions
    'distinct': lambda r, s: (r.permutation(int(np.prod(s))).reshape(s) * 0.1 - 0.1 * np.prod(s) / 2
                              + r.uniform(0, 0.02, s)),
    # maximum/minimum: 'even' values lie in [2k, 2k + 0.5], 'odd' ones in [2k + 1, 2k + 1.5]: never within 0.5
    'even': lambda r, s: 2.0 * r.integers(-1, 2, s) + r.uniform(0, 0.5, s),
    'odd': lambda r, s: 2.0 * r.integers(-1, 2, s) + 1 + r.uniform(0, 0.5, s),
    # x mod y: x = k + frac (frac in [0.25, 0.75]) and |y| in [1, 1.04] keep x / y at least 0.06 from an integer
    'mod_num': lambda r, s: r.integers(-3, 4, s) + r.uniform(0.25, 0.75, s),
    'mod_den': lambda r, s: _sign(r, s) * r.uniform(1, 1.04, s),
    # clip to [-0.5, 0.5]: values at least 0.1 away from either bound
    'clip': lambda r, s: r.choice([-1.0, 0.0, 1.0], s) * r.uniform(0.6, 2, s) + (r.random(s) < 0.3) * r.uniform(-0.4, 0.4, s),
    'inner': lambda r, s: r.uniform(-0.8, 0.8, s),                            # arcsin, arctanh: slopes blow up at +-1
    'above1': lambda r, s: r.uniform(1.25, 3, s),                              # arccosh: defined above 1
    'some_nan': lambda r, s: np.where(r.random(s) < 0.2, np.nan, r.uniform(-2, 2, s)),   # nan-functions skip them
    # ties-free in absolute value and |x| >= 0.25, for norms (abs, then max/min or a sum)
    'distinct_away0': lambda r, s: _sign(r, s) * ((r.permutation(int(np.prod(s))).reshape(s) + 2.5) * 0.1 + r.uniform(0, 0.02, s)),
}

def values(data, shape, kind='real'):
    "A float64 array of `shape` whose values are of `kind`, from a seed hypothesis draws."
    r = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label='seed'))
    return np.asarray(KINDS[kind](r, tuple(shape)), np.float64).reshape(shape)

def number(data, kind='real'): return float(values(data, (), kind))

# --- shapes and axes ----------------------------------------------------------------------------------------
def shape_st(min_dims=0, max_dims=3, empty=True): return array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0 if empty else 1, max_side=3)

def axis_st(ndim, tuples=True, none=True):
    "None, an int (negative too), or a tuple of distinct axes (the empty tuple too): every form NumPy accepts."
    options = []
    if none: options.append(st.none())
    if ndim: options.append(st.integers(-ndim, ndim - 1))
    if tuples: options.append(valid_tuple_axes(ndim, min_size=0 if none else 1).map(lambda t: tuple(a % ndim - (ndim if i % 2 else 0) for i, a in enumerate(t))))
    return st.one_of(*options)

def reduced_count(shape, axis):
    if axis is None: return int(np.prod(shape))
    axes = (axis,) if isinstance(axis, int) else axis
    return int(np.prod([shape[a] for a in axes]))

# --- the spec table -------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Spec:
    "How to test one way into the engine: the entry points it reaches, a function, and how to draw its inputs."
    name: str
    covers: tuple                  # entry points: 'numpy.<ufunc or function>', 'Traced.<member>', 'fastad.<name>'
    fn: Callable                   # fn(*xs, **kw): xs are differentiated, kw are constants (arrays, axes, ...)
    draw: Callable                 # draw(data) -> (xs, kw): float64 NumPy arrays and keywords
    note: str = ''                 # the domain, and why
    scalars: bool = False          # elementwise: also checked on Python floats and NumPy scalars
    second_order: bool = True      # the pullback itself differentiable here
    host_only: bool = False        # its constants are host objects (a nested list): NumPy backend only
    exact: bool = True             # the value equals the plain call bit for bit (else: within 1e-12, another
                                   # summation order or interpolation formula, equally accurate)
    float64_value: bool = False    # its value is float64 whatever the input's precision (np.float_power)

SPECS = []
def spec(name, covers, fn, draw, **kw):
    if name.startswith('np.') and ' ' not in name and numpy_function(name[3:]) is None: return   # NumPy 2.0 lacks 2.1's names
    SPECS.append(Spec(name, tuple(covers), fn, draw, **kw))

def elementwise(*kinds, empty=True):
    "One input per kind, of mutually broadcastable shapes (0 to 3 dims, size-0 and size-1 axes included)."
    def draw(data):
        if len(kinds) == 1: shapes = [data.draw(shape_st(empty=empty))]
        else: shapes = data.draw(mutually_broadcastable_shapes(num_shapes=len(kinds), min_dims=0, max_dims=3,
                                                                min_side=0 if empty else 1, max_side=3)).input_shapes
        return [values(data, s, k) for s, k in zip(shapes, kinds)], {}
    return draw

def with_number(kind, number_kind):
    "One array input of `kind` and a Python float constant `c` of `number_kind` (the operators' fast path)."
    def draw(data): return [values(data, data.draw(shape_st()), kind)], dict(c=number(data, number_kind))
    return draw

def with_constant(kinds, const):
    "Two inputs of mutually broadcastable shapes; the one named `const` ('a' or 'b') is a constant array."
    def draw(data):
        sa, sb = data.draw(mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3)).input_shapes
        a, b = values(data, sa, kinds[0]), values(data, sb, kinds[1])
        return ([b], dict(a=a)) if const == 'a' else ([a], dict(b=b))
    return draw

# the ufuncs' specs (np.exp, np.add, ...) are derived from their rules' domains: see `derived_specs` below
spec("-x", ["Traced.__neg__"], lambda x: -x, elementwise('real'), scalars=True)
spec("+x", ["Traced.__pos__"], lambda x: +x, elementwise('real'), scalars=True)
spec("abs(x)", ["Traced.__abs__"], abs, elementwise('away0'), note='|x| >= 0.25', scalars=True)
spec("fd.with_derivative", ["fastad.with_derivative"], lambda x: fd.with_derivative(x, lambda g: None), elementwise('real'),
     note="a hook that returns None: the cotangent passes unchanged")
spec("fd.relu", ["fastad.relu"], fd.relu, elementwise('away0'), note='|x| >= 0.25: away from the kink at 0', scalars=True)

BINARY = [  # (name, covers, fn, kinds of the two inputs, note)
    ('a + b', ['Traced.__add__', 'Traced.__radd__'], lambda a, b: a + b, ('real', 'real'), ''),
    ('a - b', ['Traced.__sub__', 'Traced.__rsub__'], lambda a, b: a - b, ('real', 'real'), ''),
    ('a * b', ['Traced.__mul__', 'Traced.__rmul__'], lambda a, b: a * b, ('real', 'real'), ''),
    ('a / b', ['Traced.__truediv__', 'Traced.__rtruediv__'], lambda a, b: a / b, ('real', 'away0'), '|b| >= 0.25'),
    ('a ** b', ['Traced.__pow__', 'Traced.__rpow__'], lambda a, b: a ** b, ('positive', 'real'), 'a in [0.5, 2]'),
    ('a % b', ['Traced.__mod__', 'Traced.__rmod__'], lambda a, b: a % b, ('mod_num', 'mod_den'), 'a / b away from integers'),
]
for name, covers, fn, kinds, note in BINARY:
    spec(name, covers, fn, elementwise(*kinds), note=note, scalars=True)
    spec(f"{name} (b constant)", covers, lambda a, b, fn=fn: fn(a, b), with_constant(kinds, 'b'), note=note)
    spec(f"{name} (a constant)", covers, lambda b, a, fn=fn: fn(a, b), with_constant(kinds, 'a'), note=note)

# the operators' fast path: a Python number on one side (no ufunc dispatch)
spec("x + c", ["Traced.__add__"], lambda x, c: x + c, with_number('real', 'real'), scalars=True)
spec("c + x", ["Traced.__radd__"], lambda x, c: c + x, with_number('real', 'real'), scalars=True)
spec("x - c", ["Traced.__sub__"], lambda x, c: x - c, with_number('real', 'real'), scalars=True)
spec("c - x", ["Traced.__rsub__"], lambda x, c: c - x, with_number('real', 'real'), scalars=True)
spec("x * c", ["Traced.__mul__"], lambda x, c: x * c, with_number('real', 'real'), scalars=True)
spec("c * x", ["Traced.__rmul__"], lambda x, c: c * x, with_number('real', 'real'), scalars=True)
spec("x / c", ["Traced.__truediv__"], lambda x, c: x / c, with_number('real', 'away0'), note='|c| >= 0.25', scalars=True)
spec("c / x", ["Traced.__rtruediv__"], lambda x, c: c / x, with_number('away0', 'real'), note='|x| >= 0.25', scalars=True)
spec("x ** c", ["Traced.__pow__"], lambda x, c: x ** c, with_number('positive', 'real'), note='x in [0.5, 2]', scalars=True)
spec("x ** 3 (an int)", ["Traced.__pow__"], lambda x: x ** 3, elementwise('real'), scalars=True)
spec("c ** x", ["Traced.__rpow__"], lambda x, c: c ** x, with_number('real', 'positive'), note='c in [0.5, 2]', scalars=True)
spec("x % c", ["Traced.__mod__"], lambda x, c: x % c, with_number('mod_num', 'mod_den'), note='x / c away from integers', scalars=True)
spec("c % x", ["Traced.__rmod__"], lambda x, c: c % x, with_number('mod_den', 'mod_num'), note='c / x away from integers', scalars=True)

# reductions
def reduction(kind='real', empty=False, keepdims=True, min_count=1):
    """A 0-3 dim input and an axis of every form (None, int, negative int, tuple, empty tuple), keepdims drawn;
    `min_count`: the fewest elements a reduction may see (2 for std: its one-element case is a known bug)."""
    def draw(data):
        shape = data.draw(shape_st(empty=empty))
        axis = data.draw(axis_st(len(shape)))
        assume(reduced_count(shape, axis) >= min_count or (empty and 0 in shape))
        kw = dict(axis=axis)
        if keepdims: kw['keepdims'] = data.draw(st.booleans())
        return [values(data, shape, kind)], kw
    return draw

spec("x.sum", ["Traced.sum"], lambda x, **k: x.sum(**k), reduction(empty=True))
spec("np.add.reduce", ["numpy.add.reduce"], lambda x, axis, keepdims: np.add.reduce(x, axis=axis, keepdims=keepdims),
     reduction(empty=True))
spec("x.mean", ["Traced.mean"], lambda x, **k: x.mean(**k), reduction())
spec("x.max", ["Traced.max"], lambda x, **k: x.max(**k), reduction('distinct'), note='no ties')
spec("x.min", ["Traced.min"], lambda x, **k: x.min(**k), reduction('distinct'), note='no ties')
spec("np.maximum.reduce", ["numpy.maximum.reduce"], lambda x, axis, keepdims: np.maximum.reduce(x, axis=axis, keepdims=keepdims),
     reduction('distinct'))

def var_std(min_count):
    def draw(data):
        xs, kw = reduction(min_count=min_count)(data)
        kw['ddof'] = data.draw(st.sampled_from([0, 1]))
        assume(reduced_count(xs[0].shape, kw['axis']) > kw['ddof'] + (min_count - 1))
        return xs, kw
    return draw

spec("np.var", ["numpy.var"], np.var, var_std(1), note='more elements than ddof')
spec("x.var", ["Traced.var"], lambda x, **k: x.var(**k), var_std(1))
spec("np.std", ["numpy.std"], np.std, var_std(2), note='at least 2 elements: std of one is a known bug, tested apart')
spec("x.std", ["Traced.std"], lambda x, **k: x.std(**k), var_std(2))

def lse(axis_required=False):
    def draw(data):
        shape = data.draw(shape_st(min_dims=1, empty=False))
        kw = dict(axis=data.draw(axis_st(len(shape), none=not axis_required)))
        return [values(data, shape)], kw
    return draw
spec("fd.logsumexp", ["fastad.logsumexp"], lambda x, axis, keepdims: fd.logsumexp(x, axis=axis, keepdims=keepdims),
     lambda data: (lambda xs_kw: (xs_kw[0], {**xs_kw[1], 'keepdims': data.draw(st.booleans())}))(lse()(data)),
     note='at least one element along the axis')
spec("fd.log_softmax", ["fastad.log_softmax"], lambda x, axis: fd.log_softmax(x, axis=axis), lse())

# a ufunc called with keywords goes through the engine's ufunc adapter (dtype= here)
spec("ufunc(dtype=)", ["numpy.ufunc"], lambda x, y: np.multiply(x, y, dtype=np.result_type(x, y)), elementwise('real', 'real'))

# the CNN layers' primitives (lesson 06): small NHWC images, both paddings, strides 1 and 2
def conv_draw(data):
    n, h, w, c, o = data.draw(st.tuples(st.integers(1, 2), st.integers(3, 5), st.integers(3, 5), st.integers(1, 2), st.integers(1, 2)))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    kw_ = dict(strides=data.draw(st.sampled_from([(1, 1), (2, 1), (2, 2)])), padding=data.draw(st.sampled_from(['valid', 'same'])))
    return [values(data, (n, h, w, c)), values(data, (kh, kw, c, o))], kw_
spec("fd.conv2d", ["fastad.conv2d"], lambda x, f, **k: fd.conv2d(x, f, **k), conv_draw, second_order=False,
     note="first order: its pullback takes sliding windows of the cotangent, which are not differentiated again")

def pool_draw(data):
    n, h, w, c = data.draw(st.tuples(st.integers(1, 2), st.integers(2, 5), st.integers(2, 5), st.integers(1, 2)))
    kw_ = dict(pool_size=data.draw(st.sampled_from([(2, 2), (1, 2), (3, 3)])), strides=data.draw(st.sampled_from([(2, 2), (1, 1)])),
               padding=data.draw(st.sampled_from(['valid', 'same'])))
    if kw_['padding'] == 'valid' and (kw_['pool_size'][0] > h or kw_['pool_size'][1] > w): kw_['padding'] = 'same'
    return [values(data, (n, h, w, c), 'distinct')], kw_
spec("fd.max_pool2d", ["fastad.max_pool2d"], lambda x, **k: fd.max_pool2d(x, **k), pool_draw,
     second_order=False, note="distinct values: no ties within a window, where the max is not differentiable; "
     "first order: its pullback scatters into windows, which is not differentiated again")

def logits_draw(data):
    n, k = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 5))
    labels = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).integers(0, k, n)
    return [values(data, (n, k))], dict(labels=labels)
spec("fd.softmax_cross_entropy", ["fastad.softmax_cross_entropy"], lambda x, labels: fd.softmax_cross_entropy(x, labels), logits_draw,
     host_only=True, note="labels are host integers")

# linear algebra (03a2): a small perturbation 0.05 m of a well-conditioned base with eigenvalues (or singular
# values) 2, 5, 8, ... kept at least 1.4 apart, so every function here is smooth around the draw; vectors are
# compared through sign-free quantities (squares), whose derivative exists when the spectrum is distinct
def base_matrix(p, q=None):
    q = p if q is None else q
    b = np.zeros((p, q))
    for i in range(min(p, q)): b[i, i] = 2.0 + 3.0 * i
    return b

def square_draw(data, batch=True):
    n = data.draw(st.integers(1, 4), label='n')
    lead = data.draw(st.sampled_from([(), (2,)])) if batch else ()
    return [values(data, (*lead, n, n))], dict(base=base_matrix(n))

def rect_draw(data, tall=False):
    p, q = data.draw(st.integers(1, 4), label='p'), data.draw(st.integers(1, 4), label='q')
    if tall and p < q: p, q = q, p
    return [values(data, (p, q))], dict(base=base_matrix(p, q))

def sym(m): return m + np.swapaxes(m, -1, -2)
def flat(*parts): return np.concatenate([np.reshape(a, (-1,)) for a in parts])

spec("np.linalg.inv", ["numpy.inv"], lambda m, base: np.linalg.inv(base + 0.05 * m), square_draw, exact=False)
def solve_draw(data):
    (m,), kw = square_draw(data, batch=False)
    n = m.shape[-1]
    return [m, values(data, data.draw(st.sampled_from([(n,), (n, 2)])))], kw
spec("np.linalg.solve", ["numpy.solve"], lambda m, b, base: np.linalg.solve(base + 0.05 * m, b), solve_draw, exact=False)
spec("np.linalg.det", ["numpy.det"], lambda m, base: np.linalg.det(base + 0.05 * m), square_draw, exact=False)
spec("np.linalg.slogdet", ["numpy.slogdet"], lambda m, base: np.linalg.slogdet(base + 0.05 * m).logabsdet, square_draw,
     exact=False, note="the log of |det|; the sign is piecewise constant")
spec("np.linalg.cholesky", ["numpy.cholesky"], lambda m, base: np.linalg.cholesky(base + 0.05 * sym(m)), square_draw,
     exact=False, note="a symmetric positive-definite input")
spec("np.linalg.eigh", ["numpy.eigh"], lambda m, base: (lambda r: flat(r.eigenvalues, r.eigenvectors ** 2))(
     np.linalg.eigh(base + 0.05 * sym(m))), lambda data: square_draw(data, batch=False), exact=False,
     note="distinct eigenvalues; eigenvectors through their squares, which do not depend on their signs")
spec("np.linalg.eigvalsh", ["numpy.eigvalsh"], lambda m, base: np.linalg.eigvalsh(base + 0.05 * sym(m)), square_draw, exact=False)
spec("np.linalg.svd", ["numpy.svd"], lambda m, base: (lambda r: flat(r.S, r.U ** 2, r.Vh ** 2))(
     np.linalg.svd(base + 0.05 * m, full_matrices=False)), rect_draw, exact=False,
     note="distinct, nonzero singular values; singular vectors through their squares")
spec("np.linalg.svdvals", ["numpy.svdvals"], lambda m, base: np.linalg.svdvals(base + 0.05 * m), rect_draw, exact=False)
spec("np.linalg.pinv", ["numpy.pinv"], lambda m, base: np.linalg.pinv(base + 0.05 * m), rect_draw, exact=False,
     note="full rank, so the rank cannot change nearby")
spec("np.linalg.qr", ["numpy.qr"], lambda m, base: (lambda r: flat(r.Q, r.R))(np.linalg.qr(base + 0.05 * m)),
     lambda data: rect_draw(data, tall=True), exact=False, note="full column rank: the reduced QR is unique")
def power_draw(data):
    xs, kw = square_draw(data)
    return xs, dict(kw, k=data.draw(st.sampled_from([1, 2, 3, -1, -2]), label="k"))
spec("np.linalg.matrix_power", ["numpy.matrix_power"], lambda m, base, k: np.linalg.matrix_power(0.3 * base + 0.05 * m, k),
     power_draw, exact=False)
spec("np.linalg.cond", ["numpy.cond"], lambda m, base: np.linalg.cond(base + 0.05 * m), square_draw, exact=False,
     note="2-norm condition number: distinct largest and smallest singular values")

# products
def matmul_draw(data):
    m, k, n = data.draw(st.tuples(*[st.integers(0, 3)] * 3), label='m, k, n')
    a_vec, b_vec = data.draw(st.booleans()), data.draw(st.booleans())
    ba, bb = data.draw(mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3)).input_shapes
    return [values(data, (k,) if a_vec else (*ba, m, k)), values(data, (k,) if b_vec else (*bb, k, n))], {}
spec("a @ b", ["Traced.__matmul__", "numpy.matmul"], lambda a, b: a @ b, matmul_draw, note='batch broadcasting, 1-d sides, zero sizes')

# in-place operators on a value that shares no memory: a new traced value, as `a = a op b` (a * 1 owns its memory)
def _in_place(op):
    def f(x, c):
        x = x * 1
        x = op(x, c)
        return x
    return f
import operator as _op
spec("x += c", ["Traced.__iadd__"], _in_place(_op.iadd), with_number('real', 'real'))
spec("x -= c", ["Traced.__isub__"], _in_place(_op.isub), with_number('real', 'real'))
spec("x *= c", ["Traced.__imul__"], _in_place(_op.imul), with_number('real', 'real'))
spec("x /= c", ["Traced.__itruediv__"], _in_place(_op.itruediv), with_number('real', 'away0'), note='|b| >= 0.25')
spec("x **= c", ["Traced.__ipow__"], _in_place(_op.ipow), with_number('positive', 'real'), note='a in [0.5, 2]')
spec("x %= c", ["Traced.__imod__"], _in_place(_op.imod), with_number('mod_num', 'mod_den'), note='a / b away from integers')
def _imatmul(a, b):
    "a @= b where NumPy allows it (the result keeps a's shape), else a @ b"
    sa, sb = np.shape(a), np.shape(b)
    fits = len(sa) >= 1 and len(sb) >= 2 and np.matmul(np.zeros(sa), np.zeros(sb)).shape == sa
    return _op.imatmul(a * 1, b) if fits else a @ b
spec("a @= b", ["Traced.__imatmul__"], _imatmul, matmul_draw, note='where NumPy allows it (the result keeps a\'s shape)')
spec("np.matmul", ["numpy.matmul"], np.matmul, matmul_draw)
spec("list @ x", ["Traced.__rmatmul__"], lambda x, a: a @ x,
     lambda data: (lambda xs, _: (assume(xs[0].size > 0),
                                  ([xs[1]], dict(a=xs[0].tolist())))[1])(*matmul_draw(data)),
     note='a list on the left, 1-d or nested: Python hands the product to the traced value', host_only=True)

def dot_draw(data):
    m, k, n = data.draw(st.tuples(*[st.integers(0, 3)] * 3))
    sa, sb = data.draw(st.sampled_from([((m, k), (k, n)), ((k,), (k,)), ((m, k), (k,)), ((k,), (k, n)), ((), (m, k)), ((m,), ())]))
    return [values(data, sa), values(data, sb)], {}
spec("np.dot", ["numpy.dot"], np.dot, dot_draw, note='2-d, 1-d and scalar operands (dot of >2-d arrays is refused)')
spec("x.dot", ["Traced.dot"], lambda a, b: a.dot(b), lambda data: (lambda xs, kw: (assume(np.ndim(xs[0]) > 0), (xs, kw))[1])(*dot_draw(data)))

EINSUM = ['ij,jk->ik', 'i,i->', 'i,j->ij', 'bij,bjk->bik', 'ij->ji', 'ij->', 'ij,j', 'ba,c', '...ij,...jk->...ik',
          '...i,...i->...', 'ij,jk,kl->il', 'ij,kj->i', 'ij,ij->ij', 'i', 'ijk->kij']
def einsum_draw(data):
    subscripts = data.draw(st.sampled_from(EINSUM))
    operands = subscripts.split('->')[0].split(',')
    sizes = {c: data.draw(st.integers(0, 3), label=c) for c in sorted(set(subscripts) - set('.,->'))}
    ellipsis = data.draw(array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    shapes = []
    for i, op in enumerate(operands):
        shape = []
        for c in op.replace('...', '*'):
            if c == '*': shape.extend(ellipsis)
            elif data.draw(st.integers(0, 4)) == 0: shape.append(1)                  # a size-1 axis that broadcasts
            else: shape.append(sizes[c])
        shapes.append(tuple(shape))
    return [values(data, s) for s in shapes], dict(subscripts=subscripts)
spec("np.einsum", ["numpy.einsum"], lambda *xs, subscripts: np.einsum(subscripts, *xs), einsum_draw,
     note='explicit and implicit outputs, ellipses, size-0 and broadcast size-1 axes (also beside a letter only that '
          'operand sums)')

# shapes and indexing
def one(min_dims=0, empty=True, kind='real'):
    def draw(data): return [values(data, data.draw(shape_st(min_dims=min_dims, empty=empty)), kind)], {}
    return draw

def reshape_draw(data):
    shape = data.draw(shape_st())
    size = int(np.prod(shape))
    options = [(-1,), tuple(shape[::-1]), (1, *shape), (*shape, 1), (size,)]
    if size: options.append((size, -1))
    return [values(data, shape)], dict(shape=data.draw(st.sampled_from(options)), order=data.draw(st.sampled_from('CF')))
spec("np.reshape", ["numpy.reshape"], lambda x, shape, order: np.reshape(x, shape, order=order), reshape_draw,
     note='C and F order, -1 in the shape')
spec("x.reshape(*shape)", ["Traced.reshape"], lambda x, shape, order: x.reshape(*shape, order=order),
     lambda data: (lambda xs, kw: (assume(kw['shape'] != ()), (xs, kw))[1])(*reshape_draw(data)))
spec("x.reshape(shape)", ["Traced.reshape"], lambda x, shape, order: x.reshape(shape, order=order), reshape_draw)

def transpose_draw(data):
    shape = data.draw(shape_st())
    axes = data.draw(st.none() | st.permutations(range(len(shape))).map(lambda p: tuple(a - len(shape) if a % 2 else a for a in p)))
    return [values(data, shape)], dict(axes=axes)
spec("np.transpose", ["numpy.transpose"], lambda x, axes: np.transpose(x, axes), transpose_draw, note='negative axes too')
spec("x.transpose(*axes)", ["Traced.transpose"], lambda x, axes: x.transpose(*(axes or ())), transpose_draw)
spec("x.transpose(axes)", ["Traced.transpose"], lambda x, axes: x.transpose(axes), transpose_draw)
spec("x.T", ["Traced.T"], lambda x: x.T, one())
spec("x.mT", ["Traced.mT"], lambda x: x.mT, one(min_dims=2))

def two_axes(data):
    shape = data.draw(shape_st(min_dims=1))
    nd = len(shape)
    return [values(data, shape)], dict(axis1=data.draw(st.integers(-nd, nd - 1)), axis2=data.draw(st.integers(-nd, nd - 1)))
spec("np.swapaxes", ["numpy.swapaxes"], lambda x, axis1, axis2: np.swapaxes(x, axis1, axis2), two_axes)
spec("x.swapaxes", ["Traced.swapaxes"], lambda x, axis1, axis2: x.swapaxes(axis1, axis2), two_axes)

def squeeze_draw(data):
    shape = list(data.draw(shape_st(max_dims=4)))
    ones = [i for i in range(len(shape)) if data.draw(st.booleans())]
    for i in ones: shape[i] = 1
    nd = len(shape)
    axis = data.draw(st.none() | (st.sampled_from(ones).map(lambda a: a - nd if a % 2 else a) if ones else st.none())
                     | st.lists(st.sampled_from(ones), unique=True).map(tuple) if ones else st.none())
    return [values(data, tuple(shape))], dict(axis=axis)
spec("np.squeeze", ["numpy.squeeze"], lambda x, axis: np.squeeze(x, axis=axis), squeeze_draw, note='None, int, tuple')
spec("x.squeeze", ["Traced.squeeze"], lambda x, axis: x.squeeze(axis), squeeze_draw)

def expand_draw(data):
    shape = data.draw(shape_st())
    k = data.draw(st.integers(1, 2))
    out = len(shape) + k
    axes = data.draw(st.lists(st.integers(0, out - 1), min_size=k, max_size=k, unique=True))
    axes = tuple(a - out if i % 2 else a for i, a in enumerate(axes))
    return [values(data, shape)], dict(axis=axes[0] if k == 1 and data.draw(st.booleans()) else axes)
spec("np.expand_dims", ["numpy.expand_dims"], lambda x, axis: np.expand_dims(x, axis), expand_draw, note='int or tuple, negative')

order = lambda data: ([values(data, data.draw(shape_st()))], dict(order=data.draw(st.sampled_from('CF'))))
spec("np.ravel", ["numpy.ravel"], lambda x, order: np.ravel(x, order=order), order)
spec("x.ravel", ["Traced.ravel"], lambda x, order: x.ravel(order), order)
spec("x.flatten", ["Traced.flatten"], lambda x, order: x.flatten(order), order)

def broadcast_draw(data):
    target = data.draw(shape_st())
    shape = data.draw(broadcastable_shapes(target, min_dims=0, max_dims=3, min_side=0, max_side=3))
    return [values(data, shape)], dict(shape=np.broadcast_shapes(shape, target))
spec("np.broadcast_to", ["numpy.broadcast_to"], lambda x, shape: np.broadcast_to(x, shape), broadcast_draw)

def index_draw(data):
    shape = data.draw(shape_st(min_dims=1))
    parts, arrays = [], 0
    for n in shape:
        kind = data.draw(st.sampled_from(['all', 'int', 'slice', 'array'] if n else ['all', 'slice']))
        if kind == 'int': parts.append(data.draw(st.integers(-n, n - 1)))
        elif kind == 'slice':
            ends = st.none() | st.integers(-n - 1, n + 1)
            parts.append(slice(data.draw(ends), data.draw(ends), data.draw(st.sampled_from([None, 1, 2, -1, -2]))))
        elif kind == 'array' and not arrays:        # repeats accumulate; one index array keeps NumPy's rules simple
            arrays += 1
            parts.append(np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=4)), dtype=np.intp))
        else: parts.append(slice(None))
    if data.draw(st.booleans()): parts.insert(data.draw(st.integers(0, len(parts))), None)
    if not arrays and data.draw(st.booleans()): parts.insert(data.draw(st.integers(0, len(parts))), Ellipsis)
    x = values(data, shape)
    if data.draw(st.integers(0, 4)) == 0: return [x], dict(index=x > 0)      # a boolean mask
    return [x], dict(index=tuple(parts))
spec("x[index]", ["Traced.__getitem__"], lambda x, index: x[index], index_draw,
     note='ints, slices with steps, an int array with repeats, None, Ellipsis, a boolean mask')
spec("x[x > 0]", ["Traced.__getitem__"], lambda x: x[x > 0], one(min_dims=1), note='a mask computed from the traced value')
spec("iterate", ["Traced.__iter__"], lambda x: sum(row * (i + 1.0) for i, row in enumerate(x)), one(min_dims=1, empty=False))
spec("scatter_add", ["fastad.primitives.scatter_add"],
     lambda g, index, like: P.scatter_add(g, index=index, like=like),
     lambda data: (lambda xs, kw: ([values(data, np.shape(xs[0][kw['index']]))], dict(index=kw['index'], like=xs[0])))(*index_draw(data)),
     note="getitem's pullback, a primitive too (it runs forward in second-order sweeps, and as itself on a traced "
          "cotangent in third-order ones)")

def _assign(x, v, index):
    y = x * 1.0
    y[index] = v                                  # recorded: y changes, x keeps its value
    return y * x
def _writes_once(x, index):
    "Whether `x[index] = v` writes each place of x once."
    places = np.arange(np.size(x)).reshape(np.shape(x))[index]
    return len(np.unique(places)) == np.size(places)

def _assign_draw(data):
    xs, kw = index_draw(data)
    # a device backend refuses a key that writes one place twice (CuPy keeps any one of the writes): NumPy only
    assume(get_backend() == 'numpy' or _writes_once(xs[0], kw['index']))
    return [xs[0], values(data, np.shape(xs[0][kw['index']]))], kw

spec("x[index] = v", ["Traced.__setitem__"], _assign, _assign_draw,
     note="the same keys as x[index]; repeated indices keep NumPy's surviving write (on NumPy; a device refuses them)")

def joined(stack):
    def draw(data):
        shape = list(data.draw(shape_st(min_dims=0 if stack else 1)))
        nd = len(shape)
        axis = data.draw(st.integers(-(nd + 1), nd) if stack else st.integers(-nd, nd - 1) | st.none())
        xs = []
        for _ in range(data.draw(st.integers(1, 3))):
            s = list(shape)
            if not stack and axis is not None: s[axis] = data.draw(st.integers(0, 3))
            if not stack and axis is None: s = list(data.draw(shape_st()))      # axis=None flattens every input
            xs.append(values(data, tuple(s)))
        return xs, dict(axis=axis)
    return draw
spec("np.concatenate", ["numpy.concatenate"], lambda *xs, axis: np.concatenate(xs, axis=axis), joined(False),
     note='1-3 inputs, int, negative and None axes, size-0 pieces')
spec("np.concatenate with a constant", ["numpy.concatenate"], lambda *xs, axis, const: np.concatenate([const, *xs], axis=axis),
     lambda data: (lambda xs, kw: (xs, {**kw, 'const': values(data, xs[0].shape)}))(*joined(False)(data)))
spec("np.stack", ["numpy.stack"], lambda *xs, axis: np.stack(xs, axis=axis), joined(True), note='1-3 inputs, every axis')

def where_draw(data):
    sc, sx, sy = data.draw(mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3)).input_shapes
    return [values(data, sx), values(data, sy)], dict(cond=values(data, sc) > 0)
spec("np.where", ["numpy.where"], lambda x, y, cond: np.where(cond, x, y), where_draw, note='condition, x and y broadcast together')
spec("np.where(x > 0, x, c)", ["numpy.where"], lambda x, c: np.where(x > 0, x, c * x), with_number('away0', 'real'),
     note='|x| >= 0.25: the condition does not flip within eps')

def clip_draw(data):
    shape = data.draw(shape_st())
    lo, hi = data.draw(st.sampled_from([(-0.5, 0.5), (None, 0.5), (-0.5, None), ('array', 'array')]))
    if lo == 'array':
        lo = np.full(data.draw(broadcastable_shapes(shape, max_dims=3, min_side=0)), -0.5)
        hi = np.full(lo.shape, 0.5)
    return [values(data, shape, 'clip')], dict(lo=lo, hi=hi)
spec("np.clip", ["numpy.clip"], lambda x, lo, hi: np.clip(x, lo, hi), clip_draw,
     note='bounds -0.5 / 0.5 (scalars, None or arrays that broadcast x); x at least 0.1 from either bound')
spec("x.clip", ["Traced.clip"], lambda x, lo, hi: x.clip(min=lo, max=hi),
     lambda data: (lambda xs, kw: (assume(kw['lo'] is not None or kw['hi'] is not None), (xs, kw))[1])(*clip_draw(data)))
spec("x.astype", ["Traced.astype"], lambda x, dtype: x.astype(dtype),
     lambda data: ([values(data, data.draw(shape_st()))], dict(dtype=data.draw(st.sampled_from([np.float64, 'float64', float])))),
     note='float64 to float64 here; the float32 property checks casts between precisions')
spec("x.copy", ["Traced.copy"], lambda x: x.copy(), one())

# --- the breadth of NumPy: 03a1's primitives and the dispatch adapters ------------------------------------------
# reductions and scans
spec("x.prod", ["Traced.prod"], lambda x, **k: x.prod(**k), reduction(empty=True))
spec("np.nansum", ["numpy.nansum"], np.nansum, reduction('some_nan', empty=True), note='a fifth of the values NaN, skipped')
spec("np.nanprod", ["numpy.nanprod"], np.nanprod, reduction('some_nan', empty=True), note='a fifth of the values NaN, skipped')
spec("np.nanmean", ["numpy.nanmean"], np.nanmean, reduction(),
     note='no NaN (an all-NaN slice is NaN, and a warning); NaN skipping: test_primitives_breadth')
for f in (np.nanmax, np.nanmin, np.ptp):
    spec(f"np.{f.__name__}", [f"numpy.{f.__name__}"], f, reduction('distinct'), note='distinct values: no ties; no empty reductions')

def quantile_draw(percent):
    def draw(data):
        xs, kw = reduction('distinct')(data)
        q = data.draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]) | st.lists(st.sampled_from([0.1, 0.25, 0.7, 0.9]), min_size=1, max_size=2))
        kw.update(q=np.multiply(q, 100).tolist() if percent else q, method=data.draw(st.sampled_from(['linear', 'lower', 'higher', 'midpoint'])))
        return xs, kw
    return draw
spec("np.median", ["numpy.median"], lambda x, axis, keepdims: np.median(x, axis=axis, keepdims=keepdims), reduction('distinct'),
     note='distinct values: sorting has no ties')
spec("np.quantile", ["numpy.quantile"], lambda x, q, **k: np.quantile(x, q, **k), quantile_draw(False), exact=False, host_only=True,
     note="distinct values; q a number or a list; the interpolation is NumPy's to rounding, so the value is compared within 1e-12")
spec("np.percentile", ["numpy.percentile"], lambda x, q, **k: np.percentile(x, q, **k), quantile_draw(True), exact=False, host_only=True)

def average_draw(data):
    xs, kw = reduction()(data)
    x, axis = xs[0], kw['axis']
    if data.draw(st.booleans(), label='weights'):
        shape = x.shape
        if isinstance(axis, int) and data.draw(st.booleans(), label='1-d weights'): shape = (x.shape[axis],)
        xs.append(values(data, shape, 'positive'))
    return xs, kw
spec("np.average", ["numpy.average"], lambda x, *w, **k: np.stack(np.average(x, weights=w[0] if w else None, returned=True, **k)),
     average_draw, exact=False, note='weights in [0.5, 2] (differentiated too), the same shape as x or 1-d along an int axis; '
     'returned=True: the sum of the weights as well')

def scan_draw(data):
    shape = data.draw(shape_st())
    return [values(data, shape)], dict(axis=data.draw(st.none() | st.integers(-len(shape), len(shape) - 1)) if shape else None)
spec("x.cumsum", ["Traced.cumsum"], lambda x, axis: x.cumsum(axis), scan_draw)
spec("x.cumprod", ["Traced.cumprod"], lambda x, axis: x.cumprod(axis), scan_draw, host_only=True,
     note="NumPy backend only: strict arrays have no .cumprod() to compare with")

def cumulative_draw(data):
    shape = data.draw(shape_st(min_dims=1))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1) | (st.none() if len(shape) == 1 else st.nothing()))
    return [values(data, shape)], dict(axis=axis, include_initial=data.draw(st.booleans()))
spec("np.cumulative_sum", ["numpy.cumulative_sum"], lambda x, **k: np.cumulative_sum(x, **k), cumulative_draw,
     note='include_initial too; axis None only for 1-d input, as NumPy asks')
spec("np.cumulative_prod", ["numpy.cumulative_prod"], lambda x, **k: np.cumulative_prod(x, **k), cumulative_draw)

def diagonal_draw(data):
    shape = data.draw(shape_st(min_dims=2))
    nd = len(shape)
    a1, a2 = data.draw(st.lists(st.integers(0, nd - 1), min_size=2, max_size=2, unique=True))
    return [values(data, shape)], dict(offset=data.draw(st.integers(-3, 3)), axis1=a1 - nd * (a1 % 2), axis2=a2)
spec("np.trace", ["numpy.trace"], lambda x, **k: np.trace(x, **k), diagonal_draw, note='offsets past the edge too (an empty diagonal)')
spec("np.linalg.trace", ["numpy.trace"], lambda x, offset, **_: np.linalg.trace(x, offset=offset), diagonal_draw)

def diff_draw(data):
    shape = data.draw(shape_st(min_dims=1))
    kw = dict(n=data.draw(st.integers(0, 2)), axis=data.draw(st.integers(-len(shape), len(shape) - 1)))
    for edge in ('prepend', 'append'):
        if data.draw(st.booleans(), label=edge): kw[edge] = number(data)
    return [values(data, shape)], kw
spec("np.diff", ["numpy.diff"], lambda x, **k: np.diff(x, **k), diff_draw, float64_value=True, note='n = 0, 1, 2 (past the '
     'length: empty), Python-float prepend/append (NumPy makes them float64 arrays: a float64 result)')

VECTOR_ORDS, MATRIX_ORDS = [None, 1, 2, np.inf, -np.inf, 0.5, 3, -1], [None, 'fro', 1, -1, np.inf, -np.inf]
def norm_draw(data):
    shape = data.draw(shape_st(min_dims=1, empty=False))
    nd = len(shape)
    form = data.draw(st.sampled_from(['all', 'vector'] + (['matrix'] if nd >= 2 else [])))
    if form == 'all': kw = dict(ord=None if nd > 2 else data.draw(st.sampled_from(VECTOR_ORDS if nd == 1 else MATRIX_ORDS)), axis=None)
    elif form == 'vector': kw = dict(ord=data.draw(st.sampled_from(VECTOR_ORDS)), axis=data.draw(st.integers(-nd, nd - 1)))
    else: kw = dict(ord=data.draw(st.sampled_from(MATRIX_ORDS)), axis=tuple(data.draw(st.permutations(range(nd)))[:2]))
    return [values(data, shape, 'distinct_away0')], dict(kw, keepdims=data.draw(st.booleans()))
NORM_NOTE = ("|x| >= 0.25 and distinct: no kink of abs, no ties of max/min; ord=0 counts nonzeros (a plain result) and the "
             "matrix 2-norms and nuclear norm need an SVD (linear algebra), so they are left out")
spec("np.linalg.norm", ["numpy.norm"], lambda x, **k: np.linalg.norm(x, **k), norm_draw, exact=False, note=NORM_NOTE)
spec("np.linalg.vector_norm", ["numpy.vector_norm"], lambda x, ord, axis, keepdims: np.linalg.vector_norm(
     x, ord=2 if ord is None else ord, axis=axis, keepdims=keepdims),
     lambda data: (lambda xs, kw: (xs, dict(kw, axis=data.draw(axis_st(xs[0].ndim)), ord=data.draw(st.sampled_from(VECTOR_ORDS)))))(*norm_draw(data)),
     exact=False, note='every axis form')
spec("np.linalg.matrix_norm", ["numpy.matrix_norm"], lambda x, ord, keepdims: np.linalg.matrix_norm(x, ord=ord or 'fro', keepdims=keepdims),
     lambda data: ([values(data, data.draw(shape_st(min_dims=2, empty=False)), 'distinct_away0')],
                   dict(ord=data.draw(st.sampled_from(MATRIX_ORDS)), keepdims=data.draw(st.booleans()))), exact=False, note=NORM_NOTE)

# products: another summation order than NumPy's, so the values are compared within 1e-12
def two_shapes(*pairs):
    "Two inputs whose shapes come from `pairs(sizes)`: a function of sizes drawn in 0..3."
    def draw(data):
        n = data.draw(st.lists(st.integers(0, 3), min_size=4, max_size=4))
        sa, sb = data.draw(st.sampled_from(pairs))(*n)
        return [values(data, sa), values(data, sb)], {}
    return draw
spec("np.outer", ["numpy.outer"], np.outer, two_shapes(lambda a, b, c, d: ((a,), (b,)), lambda a, b, c, d: ((a, b), (c,)),
                                                       lambda a, b, c, d: ((), (a, b))), note='any shapes: both are flattened')
spec("np.linalg.outer", ["numpy.outer"], np2.linalg.outer, two_shapes(lambda a, b, c, d: ((a,), (b,))), note='1-d only, as NumPy asks')
spec("np.inner", ["numpy.inner"], np.inner, two_shapes(lambda a, b, c, d: ((a, b), (c, b)), lambda a, b, c, d: ((b,), (c, d, b)),
                                                       lambda a, b, c, d: ((), (a, b))), exact=False, note='a scalar side too')
def tensordot_draw(data):
    k = data.draw(st.integers(0, 2))
    contracted = data.draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
    free_a, free_b = data.draw(shape_st(max_dims=2)), data.draw(shape_st(max_dims=2))
    a, b = values(data, (*free_a, *contracted)), values(data, (*contracted, *free_b))
    na = a.ndim
    axes = data.draw(st.sampled_from([k, (list(range(na - k, na))[::-1], list(range(k))[::-1]),
                                      ([i - na for i in range(na - k, na)], list(range(k)))]))
    return [a, b], dict(axes=axes)
spec("np.tensordot", ["numpy.tensordot"], lambda a, b, axes: np.tensordot(a, b, axes), tensordot_draw, exact=False,
     note='0-2 contracted axes: an int, pairs in either order, negative axes')
spec("np.linalg.tensordot", ["numpy.tensordot"], lambda a, b, axes: np.linalg.tensordot(a, b, axes=axes), tensordot_draw, exact=False)
spec("np.kron", ["numpy.kron"], np.kron, lambda data: ([values(data, data.draw(shape_st(max_dims=2))) for _ in range(2)], {}),
     note='0-2 dims each, size-0 axes too')
def cross_draw(data):
    sa, sb = data.draw(mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3)).input_shapes
    return [values(data, (*sa, 3)), values(data, (*sb, 3))], {}
spec("np.cross", ["numpy.cross"], np.cross, cross_draw, note='3-vectors in broadcast batches (2-vectors are deprecated in NumPy 2)')
spec("np.linalg.cross", ["numpy.cross"], np2.linalg.cross, cross_draw)
def vdot_draw(data):
    shape = data.draw(shape_st())
    return [values(data, shape), values(data, shape[::-1])], {}
spec("np.vdot", ["numpy.vdot"], np.vdot, vdot_draw, exact=False, note='two shapes of one size: both flattened')
def multi_dot_draw(data):
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=3, max_size=5))
    shapes = [(sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1)]
    if data.draw(st.booleans()): shapes[0] = shapes[0][1:]
    if data.draw(st.booleans()): shapes[-1] = shapes[-1][:1]
    return [values(data, s) for s in shapes], {}
spec("np.linalg.multi_dot", ["numpy.multi_dot"], lambda *xs: np.linalg.multi_dot(xs), multi_dot_draw, exact=False,
     note='2-4 matrices, the first and last possibly 1-d')
def vecdot_draw(data):
    sa, sb = (list(s) for s in data.draw(mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=3, max_side=3)).input_shapes)
    axis = data.draw(st.integers(-min(len(sa), len(sb)), -1))
    sa[axis] = sb[axis] = data.draw(st.integers(0, 3))             # the summed axis: one length on both sides
    return [values(data, tuple(sa)), values(data, tuple(sb))], dict(axis=axis)
spec("np.linalg.vecdot", ["numpy.vecdot"], lambda a, b, axis: np.linalg.vecdot(a, b, axis=axis), vecdot_draw, exact=False,
     note='broadcast inputs, any axis both have (of one length on both sides, as NumPy asks)')

# shapes and indexing
def take_draw(data):
    shape = data.draw(shape_st(min_dims=1))
    x = values(data, shape)
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    n = x.size if axis is None else shape[axis]
    mode = data.draw(st.sampled_from(['raise', 'wrap', 'clip']) if n else st.just('raise'))
    lo, hi = (-n, n - 1) if mode == 'raise' else (-2 * n - 1, 2 * n + 1)
    indices = data.draw(st.lists(st.integers(lo, hi), max_size=4) if n else st.just([]))
    return [x], dict(indices=np.array(indices, dtype=np.intp), axis=axis, mode=mode)
spec("np.take", ["numpy.take"], lambda x, **k: np.take(x, **k), take_draw, note="repeats, negative indices, 'wrap' and 'clip' out of range")
spec("x.take", ["Traced.take"], lambda x, indices, axis, mode: x.take(indices, axis, mode=mode), take_draw)

def take_along_draw(data):
    shape = data.draw(shape_st(min_dims=1, empty=False))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ishape = [1 if data.draw(st.booleans()) else n for n in shape]
    ishape[axis] = data.draw(st.integers(0, 4))
    r = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    return [values(data, shape)], dict(indices=r.integers(-shape[axis], shape[axis], ishape), axis=axis)
spec("np.take_along_axis", ["numpy.take_along_axis"], lambda x, **k: np.take_along_axis(x, **k), take_along_draw,
     note='indices broadcast over the other axes, repeats and negative ones')

def put_along_draw(data):
    xs, kw = take_along_draw(data)
    r = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    n = xs[0].shape[kw['axis']]
    kw['indices'] = r.integers(0, n, kw['indices'].shape)
    return [xs[0], values(data, kw['indices'].shape)], kw
spec("fd.put_along_axis", ["fastad.put_along_axis"], lambda x, v, **k: fd.put_along_axis(x, k['indices'], v, k['axis']), put_along_draw,
     note='arr and values both differentiated; a repeated index keeps the last value written (the others have no slope)')

def repeat_draw(data):
    shape = data.draw(shape_st())
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1)) if shape else None
    n = int(np.prod(shape)) if axis is None else shape[axis]
    repeats = data.draw(st.integers(0, 3) | (st.lists(st.integers(0, 3), min_size=n, max_size=n) if n else st.nothing()))
    return [values(data, shape)], dict(repeats=repeats, axis=axis)
spec("np.repeat", ["numpy.repeat"], lambda x, **k: np.repeat(x, **k), repeat_draw, note='a count or one per element, 0 too')
spec("x.repeat", ["Traced.repeat"], lambda x, repeats, axis: x.repeat(repeats, axis), repeat_draw)
spec("np.tile", ["numpy.tile"], lambda x, reps: np.tile(x, reps),
     lambda data: ([values(data, data.draw(shape_st()))], dict(reps=data.draw(st.integers(0, 3) | st.lists(st.integers(0, 3), max_size=4).map(tuple)))),
     note='reps an int or a tuple longer or shorter than the shape, 0 too')

def pad_draw(data):
    mode = data.draw(st.sampled_from(['constant', 'edge', 'reflect', 'symmetric', 'wrap']))
    shape = data.draw(shape_st(min_dims=1, empty=mode == 'constant'))
    width = st.integers(0, 3)
    pad = data.draw(width | st.tuples(width, width) | st.lists(st.tuples(width, width), min_size=len(shape), max_size=len(shape)).map(tuple))
    kw = dict(pad_width=pad, mode=mode)
    if mode == 'constant' and data.draw(st.booleans()): kw['constant_values'] = number(data)
    return [values(data, shape)], kw
spec("np.pad", ["numpy.pad"], lambda x, **k: np.pad(x, **k), pad_draw,
     note="constant, edge, reflect, symmetric and wrap (wider than the axis too); non-empty axes for the modes that read x")

def axes_draw(min_dims=0, tuples=True, none=True):
    def draw(data):
        shape = data.draw(shape_st(min_dims=min_dims))
        return [values(data, shape)], dict(axis=data.draw(axis_st(len(shape), tuples=tuples, none=none)))
    return draw
spec("np.flip", ["numpy.flip"], lambda x, axis: np.flip(x, axis), axes_draw(), note='None, int, tuple')
spec("np.flipud", ["numpy.flipud"], np.flipud, one(min_dims=1))
spec("np.fliplr", ["numpy.fliplr"], np.fliplr, one(min_dims=2))
def rot90_draw(data):
    shape = data.draw(shape_st(min_dims=2))
    axes = tuple(data.draw(st.permutations(range(len(shape))))[:2])
    return [values(data, shape)], dict(k=data.draw(st.integers(-3, 4)), axes=(axes[0] - len(shape), axes[1]))
spec("np.rot90", ["numpy.rot90"], lambda x, **k: np.rot90(x, **k), rot90_draw, note='every k, any pair of axes')
def roll_draw(data):
    shape = data.draw(shape_st())
    nd = len(shape)
    form = data.draw(st.sampled_from(['flat', 'int', 'tuple'] if nd else ['flat']))
    if form == 'flat': return [values(data, shape)], dict(shift=data.draw(st.integers(-4, 4)), axis=None)
    if form == 'int': return [values(data, shape)], dict(shift=data.draw(st.integers(-4, 4)), axis=data.draw(st.integers(-nd, nd - 1)))
    axis = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=3).map(tuple))
    return [values(data, shape)], dict(shift=tuple(data.draw(st.integers(-4, 4)) for _ in axis), axis=axis)
spec("np.roll", ["numpy.roll"], lambda x, **k: np.roll(x, **k), roll_draw, note='flat, one axis, several (an axis named twice too)')
def moveaxis_draw(data):
    shape = data.draw(shape_st(min_dims=1))
    nd = len(shape)
    k = data.draw(st.integers(1, nd))
    src, dst = (tuple(a - nd * (a % 2) for a in data.draw(st.permutations(range(nd)))[:k]) for _ in range(2))
    return [values(data, shape)], dict(source=src[0] if k == 1 else src, destination=dst[0] if k == 1 else dst)
spec("np.moveaxis", ["numpy.moveaxis"], lambda x, **k: np.moveaxis(x, **k), moveaxis_draw, note='ints or tuples, negative too')
spec("np.rollaxis", ["numpy.rollaxis"], lambda x, axis, start: np.rollaxis(x, axis, start),
     lambda data: (lambda shape: ([values(data, shape)], dict(axis=data.draw(st.integers(-len(shape), len(shape) - 1)),
                                                              start=data.draw(st.integers(-len(shape), len(shape))))))(data.draw(shape_st(min_dims=1))))
spec("np.matrix_transpose", ["numpy.matrix_transpose"], np2.matrix_transpose, one(min_dims=2))
spec("np.linalg.matrix_transpose", ["numpy.matrix_transpose"], np2.linalg.matrix_transpose, one(min_dims=2))
spec("np.diag", ["numpy.diag"], lambda x, k: np.diag(x, k),
     lambda data: ([values(data, data.draw(shape_st(min_dims=1, max_dims=2)))], dict(k=data.draw(st.integers(-3, 3)))),
     note='1-d (builds a matrix) and 2-d (reads a diagonal), offsets past the edge too')
spec("np.diagflat", ["numpy.diagflat"], lambda x, k: np.diagflat(x, k),
     lambda data: ([values(data, data.draw(shape_st()))], dict(k=data.draw(st.integers(-2, 2)))))
spec("np.diagonal", ["numpy.diagonal"], lambda x, **k: np.diagonal(x, **k), diagonal_draw)
spec("np.linalg.diagonal", ["numpy.diagonal"], lambda x, offset, **_: np.linalg.diagonal(x, offset=offset), diagonal_draw)
spec("x.diagonal", ["Traced.diagonal"], lambda x, offset, axis1, axis2: x.diagonal(offset, axis1, axis2), diagonal_draw)
spec("x.trace", ["Traced.trace"], lambda x, **k: x.trace(**k), diagonal_draw, note="NumPy's trace: the engine's own slot is _trace")
tri_draw = lambda data: ([values(data, data.draw(shape_st(min_dims=1)))], dict(k=data.draw(st.integers(-3, 3))))
spec("np.triu", ["numpy.triu"], lambda x, k: np.triu(x, k), tri_draw, note='a 1-d input is a row repeated into a matrix')
spec("np.tril", ["numpy.tril"], lambda x, k: np.tril(x, k), tri_draw)
for f in (np.atleast_1d, np.atleast_2d, np.atleast_3d):
    spec(f"np.{f.__name__}", [f"numpy.{f.__name__}"], f, one(), note='0-3 dims')
def sort_draw(data):
    shape = data.draw(shape_st())
    return [values(data, shape, 'distinct')], dict(axis=data.draw(axis_st(len(shape), tuples=False, none=True)) if shape else None)
spec("np.sort", ["numpy.sort"], lambda x, axis: np.sort(x, axis=axis), sort_draw, note='distinct values: no ties; axis None flattens')
def partition_draw(data):
    shape = data.draw(shape_st(min_dims=1, empty=False))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    kth = data.draw(st.integers(-n, n - 1) | st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True))
    return [values(data, shape, 'distinct')], dict(kth=kth, axis=axis)
spec("np.partition", ["numpy.partition"], lambda x, **k: np.partition(x, **k), partition_draw, note='distinct values: no ties')
# results that move with a float input: they have derivatives now, not a place in the no-derivative table
spec("np.unique", ["numpy.unique"], lambda x: np.unique(x), one(kind='distinct'), note='distinct values: each its own first occurrence')
def bincount_draw(data):
    n = data.draw(st.integers(1, 5))                   # none: NumPy's result is integer zeros, with no derivative
    index = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).integers(0, 4, n)
    return [values(data, (n,))], dict(index=index, minlength=data.draw(st.integers(0, 6)))
spec("np.bincount", ["numpy.bincount"], lambda w, index, minlength: np.bincount(index, weights=w, minlength=minlength),
     bincount_draw, exact=False, note='traced weights, each summed into its bin')
def histogram_draw(density):
    def draw(data):
        n = data.draw(st.integers(2, 8))                # one value sits on the middle edge of its own range
        return [values(data, (n,)), values(data, (n,), 'positive')], dict(bins=data.draw(st.integers(1, 4)), density=density)
    return draw
spec("np.histogram", ["numpy.histogram"], lambda a, w, **k: np.concatenate(np.histogram(a, weights=w, **k)), histogram_draw(False),
     exact=False, note='counts and edges joined; random values, none on an inner edge; the edges follow min and max')
spec("np.histogram (density)", ["numpy.histogram"], lambda a, w, **k: np.concatenate(np.histogram(a, weights=w, **k)),
     histogram_draw(True), exact=False, float64_value=True, note='as NumPy, a density is float64')
spec("np.heaviside", ["numpy.heaviside"], lambda h, x: np.heaviside(x.astype(np.float32), h),   # x float32: h sets the precision
     lambda data: (lambda s: ([values(data, s)], dict(x=np.round(values(data, s)))))(data.draw(shape_st())),
     note='x rounded: zeros, where the value is h')
def compress_draw(data):
    shape = data.draw(shape_st(min_dims=1))
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    n = int(np.prod(shape)) if axis is None else shape[axis]
    return [values(data, shape)], dict(condition=data.draw(st.lists(st.booleans(), max_size=n)), axis=axis)
spec("np.compress", ["numpy.compress"], lambda x, condition, axis: np.compress(condition, x, axis), compress_draw,
     note='a condition shorter than the axis too', host_only=True)
spec("x.compress", ["Traced.compress"], lambda x, condition, axis: x.compress(condition, axis), compress_draw, host_only=True)
spec("np.select", ["numpy.select"], lambda x: np.select([x > 0.5, x < -0.5], [x * 2, x ** 2], default=-x), elementwise('clip'),
     note='x at least 0.1 from the thresholds -0.5 and 0.5, where the choice changes')
def windows_draw(data):
    shape = data.draw(shape_st(min_dims=1, empty=False))
    axes = data.draw(st.none() | st.permutations(range(len(shape))).map(lambda p: tuple(p[:len(p) // 2 + 1])))
    window = tuple(data.draw(st.integers(1, shape[a])) for a in (range(len(shape)) if axes is None else axes))
    return [values(data, shape)], dict(window_shape=window if len(window) > 1 or data.draw(st.booleans()) else window[0], axis=axes)
spec("sliding_window_view", ["numpy.sliding_window_view"],
     lambda x, **k: np.lib.stride_tricks.sliding_window_view(x, **k), windows_draw, note='windows along all axes or some, any size')
def window_sum_draw(data):
    (x,), kw = windows_draw(data)
    window = (kw['window_shape'],) if np.ndim(kw['window_shape']) == 0 else kw['window_shape']
    axis = tuple(range(x.ndim)) if kw['axis'] is None else kw['axis']
    g = np.lib.stride_tricks.sliding_window_view(x, window, axis)
    return [values(data, g.shape)], dict(shape=x.shape, window_shape=window, axis=axis)
spec("window_sum", ["fastad.primitives_more.window_sum"], lambda g, **k: PM.window_sum(g, **k), window_sum_draw,
     note="sliding_window_view's pullback, a primitive too (it runs forward in sweeps that differentiate a pullback "
          "whose cotangent is traced)")

# joining and splitting: pieces of shapes each join accepts
def pieces(data, make):
    "1-3 pieces, `make(data)` drawing each one's shape around shared sizes."
    return [values(data, make(data)) for _ in range(data.draw(st.integers(1, 3)))], {}
def stack_draw(rule, min_dims=0):
    def draw(data):
        t = data.draw(shape_st(min_dims=min_dims, max_dims=2))
        return pieces(data, lambda d: rule(d, t))
    return draw
spec("np.vstack", ["numpy.vstack"], lambda *xs: np.vstack(xs),
     stack_draw(lambda d, t: (d.draw(st.integers(0, 3)), *t) if len(t) != 1 or d.draw(st.booleans()) else t, min_dims=1),
     note='rows: 1-d pieces and 2-d or 3-d ones')
spec("np.hstack", ["numpy.hstack"], lambda *xs: np.hstack(xs),
     stack_draw(lambda d, t: (d.draw(st.integers(0, 3)),) if not t else (t[0], d.draw(st.integers(0, 3)), *t[1:])),
     note='1-d pieces end to end, or along the second axis')
spec("np.dstack", ["numpy.dstack"], lambda *xs: np.dstack(xs),
     stack_draw(lambda d, t: (*(t + (2,) * 2)[:2], d.draw(st.integers(0, 3))) if d.draw(st.booleans()) else (t + (2,) * 2)[:2]),
     note='2-d pieces (as depth 1) and 3-d ones')
spec("np.column_stack", ["numpy.column_stack"], lambda *xs: np.column_stack(xs),
     stack_draw(lambda d, t: ((t + (2,))[0],) if d.draw(st.booleans()) else ((t + (2,))[0], d.draw(st.integers(0, 3)))),
     note='1-d pieces as columns, 2-d ones')
def append_draw(data):
    if data.draw(st.booleans()): return [values(data, data.draw(shape_st())) for _ in range(2)], dict(axis=None)
    (a, *_), kw = joined(False)(data)
    b = list(a.shape)
    if kw['axis'] is not None: b[kw['axis']] = data.draw(st.integers(0, 3))
    return [a, values(data, tuple(b))], kw
spec("np.append", ["numpy.append"], lambda a, b, axis: np.append(a, b, axis=axis), append_draw, note='flat (any shapes) or along an axis')
def block_draw(data):
    m1, m2, n1, n2 = data.draw(st.lists(st.integers(1, 3), min_size=4, max_size=4))
    return [values(data, s) for s in ((m1, n1), (m1, n2), (m2, n1), (m2, n2))], {}
spec("np.block", ["numpy.block"], lambda a, b, c, d: np.block([[a, b], [c, d, ]]), block_draw, note='2x2 blocks of matrices')
spec("np.block 1-d", ["numpy.block"], lambda a, b: np.block([np.ravel(a), np.ravel(b), 1.0]), elementwise('real', 'real'),
     float64_value=True, note="pieces end to end, with a Python float, which NumPy's block makes a float64 array")

def weighted_pieces(pieces): return np.concatenate([np.ravel(p) * (i + 1.0) for i, p in enumerate(pieces)])
def split_draw(min_dims, axis_of, equal):
    def draw(data):
        shape = list(data.draw(shape_st(min_dims=min_dims)))
        axis = axis_of(data, len(shape))
        if data.draw(st.booleans()):                   # sections: equal ones need a divisible length
            k = data.draw(st.integers(1, 3))
            if equal: shape[axis] = k * data.draw(st.integers(0, 2))
            return [values(data, tuple(shape))], dict(sections=k, axis=axis)
        cuts = sorted(data.draw(st.lists(st.integers(-4, 4), max_size=3)))
        return [values(data, tuple(shape))], dict(sections=cuts, axis=axis)
    return draw
any_axis = lambda data, nd: data.draw(st.integers(-nd, nd - 1))
spec("np.split", ["numpy.split"], lambda x, sections, axis: weighted_pieces(np.split(x, sections, axis=axis)),
     split_draw(1, any_axis, True), note='equal sections or cut points (out of range and negative too); pieces weighted 1, 2, ...')
spec("np.array_split", ["numpy.array_split"], lambda x, sections, axis: weighted_pieces(np.array_split(x, sections, axis=axis)),
     split_draw(1, any_axis, False), note='unequal sections too')
spec("np.hsplit", ["numpy.hsplit"], lambda x, sections, axis: weighted_pieces(np.hsplit(x, sections)),
     split_draw(1, lambda data, nd: 1 if nd > 1 else 0, True))
spec("np.vsplit", ["numpy.vsplit"], lambda x, sections, axis: weighted_pieces(np.vsplit(x, sections)), split_draw(2, lambda data, nd: 0, True))
spec("np.dsplit", ["numpy.dsplit"], lambda x, sections, axis: weighted_pieces(np.dsplit(x, sections)), split_draw(3, lambda data, nd: 2, True))
spec("np.unstack", ["numpy.unstack"], lambda x, axis: weighted_pieces(np.unstack(x, axis=axis)),
     lambda data: (lambda shape: ([values(data, shape)], dict(axis=data.draw(st.integers(-len(shape), len(shape) - 1)))))(
         data.draw(shape_st(min_dims=1, empty=False))), note='non-empty: no pieces, nothing to join')

# building arrays
def linspace_draw(data):
    sa, sb = data.draw(mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3)).input_shapes
    nd = len(np.broadcast_shapes(sa, sb)) + 1
    return [values(data, sa), values(data, sb)], dict(num=data.draw(st.integers(0, 4)), endpoint=data.draw(st.booleans()),
                                                      axis=data.draw(st.integers(-nd, nd - 1)))
spec("np.linspace", ["numpy.linspace"], lambda a, b, **k: np.linspace(a, b, **k), linspace_draw, exact=False,
     note='broadcast ends, 0-4 points, with and without the end point, any axis')
spec("np.logspace", ["numpy.logspace"], lambda a, b, **k: np.logspace(a, b, base=2.0, **k), linspace_draw, exact=False,
     note='base 2: ends in [-2, 2] keep the values modest')
spec("np.full_like", ["numpy.full_like"], lambda a, f: np.full_like(a, f),
     lambda data: (lambda shape: ([values(data, shape), values(data, data.draw(broadcastable_shapes(shape, max_dims=len(shape), min_side=0).filter(lambda f: np.broadcast_shapes(f, shape) == shape)))], {}))(data.draw(shape_st())),
     note='a traced fill value that broadcasts into `a`\'s shape (a side of 0 fills no side of 1); `a` gives only the shape, so its gradient is zero')
spec("np.copy", ["numpy.copy"], np.copy, one())

def _like_then_written(make):
    "`make(x)` (np.zeros_like and its kin) of a traced x: a constant of x's recording, which then records a write into it."
    def fn(x):
        y = make(x)
        if make is np.empty_like: y[...] = 0.0          # its values are whatever the memory held: written over first
        y[..., :1] = x[..., :1] * 2.0                  # recorded into the new array
        return y * x + y
    return fn
for f in P.groups()['building arrays']:            # the *_like rows of the registry; full_like has its spec above
    if f.__name__.endswith('_like') and f is not np.full_like:
        spec(f"np.{f.__name__}", [f"numpy.{f.__name__}"], _like_then_written(f), one(min_dims=1),
             note='x gives the shape; the new array is a constant until a traced value is written into it')

def _at(ufunc):
    "`ufunc.at(y, index, v)` (np.add.at, np.subtract.at) into a traced copy y of a: repeated indices accumulate."
    def fn(a, v, index):
        y = a * 1.0
        ufunc.at(y, index, v)                         # Traced.ufunc_at: y += scatter_add(±v, index)
        return y * a
    return fn
def at_draw(data):
    shape = data.draw(shape_st(min_dims=1, empty=False))
    index = np.array(data.draw(st.lists(st.integers(-shape[0], shape[0] - 1), max_size=5)), dtype=np.intp)
    if data.draw(st.booleans()) and len(shape) > 1: index = (index, slice(None))
    vshape = np.zeros(shape)[index].shape
    if data.draw(st.booleans()): vshape = vshape[data.draw(st.integers(0, len(vshape))):]   # v broadcasts into y[index]
    return [values(data, shape), values(data, vshape)], dict(index=index)
for ufunc in (np.add, np.subtract):
    spec(f"np.{ufunc.__name__}.at", ["Traced.ufunc_at"], _at(ufunc), at_draw, exact=False,
         note='an int array on the first axis with repeats and negatives (also with a slice after it); v broadcast too; '
              'the repeats are summed before they are added (another order of the same sum)')
spec("x.conj", ["Traced.conj", "Traced.conjugate"], lambda x: x.conj() * x.conjugate(), elementwise('real'),
     host_only=True, note='real values are their own conjugates; NumPy backend only: strict arrays have no .conj()')

# --- specs derived from the rules ----------------------------------------------------------------------------------
# A rule says where its tests draw inputs (`domain=` of `fastad.primitives.defvwc`): a drawer, its words, and why.
# The drawers below call the rule's NumPy callable itself, `f(*xs, **kw)`; the others name a drawer whose hand-written
# spec (above) calls it another way (a keyword NumPy 2.0 spells differently, a list of arrays).
def domain_of(prim):
    "A rule's domain as (drawer, words, note)."
    head, _, note = prim.domain.partition(':')
    drawer, *words = head.split()
    return drawer, words, note.strip()

def _float64_value(f, n):
    "Whether `f` gives float64 from float32 inputs (np.float_power)."
    with np.errstate(all='ignore'): return np.asarray(f(*[np.ones(1, np.float32)] * n)).dtype == np.float64

DERIVED = {   # drawer -> (words, f) -> (draw, Spec options)
    'elementwise': lambda kinds, f: (elementwise(*kinds, empty=not {'inner', 'above1'} & set(kinds)),
                                     dict(scalars=True, float64_value=_float64_value(f, len(kinds)))),
    'reduction': lambda words, f: (reduction('distinct' if 'distinct' in words else 'real', empty='empty' in words), {}),
    'scan': lambda words, f: (scan_draw, {}),
}
DRAWERS = {   # the other drawers a domain may name: each a spec above, which calls the rule its own way
    'matmul', 'dot', 'einsum', 'variance', 'deviation', 'reshape', 'transpose', 'two_axes', 'squeeze', 'expand', 'order',
    'broadcast', 'scatter', 'index', 'joined', 'stacked', 'where', 'clip', 'softmax', 'heaviside', 'norm', 'flip', 'roll',
    'tri', 'diagonal', 'pad', 'windows', 'put_along_axis', 'square', 'solve', 'symmetric', 'rect', 'tall', 'hook',
    'conv', 'pool', 'logits'}   # the CNN rules (06): conv_draw, pool_draw, logits_draw

def rules():
    "Every rule the registry's rows hold, and every one made with `defvwc` in fastad's modules: {name: Primitive}."
    found = {}
    for module in [importlib.import_module(f"fastad.{i.name}") for i in pkgutil.iter_modules(fd.__path__)]:
        for v in vars(module).values():
            for p in (v, getattr(v, 'primitive', None)):
                if type(p) is P.Primitive: found.setdefault(p.name, p)
    found.update({row.primitive.name: row.primitive for row in P.REGISTRY.values() if type(row.primitive) is P.Primitive})
    return found

def derived_specs():
    "A spec for each NumPy callable whose rule's domain names a drawer of DERIVED."
    for f, row in list(P.REGISTRY.items()):
        if type(row.primitive) is not P.Primitive or row.primitive.domain is None: continue
        drawer, words, note = domain_of(row.primitive)
        if drawer in DERIVED and f.__name__ != 'heaviside':
            draw, options = DERIVED[drawer](words, f)
            spec(f"np.{f.__name__}", [f"numpy.{f.__name__}"], f, draw, note=note, **options)
            if drawer == 'elementwise' and len(words) == 2 and row.primitive.vwc.__module__ == P.__name__:   # 03a's: one side constant too
                spec(f"np.{f.__name__} (b constant)", [f"numpy.{f.__name__}"], lambda a, b, f=f: f(a, b),
                     with_constant(words, 'b'), note=note)
                spec(f"np.{f.__name__} (a constant)", [f"numpy.{f.__name__}"], lambda b, a, f=f: f(a, b),
                     with_constant(words, 'a'), note=note)
derived_specs()

# --- what the spec table must cover ------------------------------------------------------------------------------
# Members of the traced value that are not differentiable operations, by design: introspection, comparisons and
# truth values (plain results), conversions that drop the derivative on purpose (they raise), piecewise-constant
# operators (`//`, round: a plain result), in-place assignment (refused), and the dispatch machinery itself.
NOT_OPERATIONS = {
    '__repr__', '__array_ufunc__', '__array_function__', '__fastad_primitive__', '__array__', '__getattr__',
    '__floordiv__', '__rfloordiv__', '__ifloordiv__', '__round__', '__lt__', '__le__', '__gt__', '__ge__', '__eq__', '__ne__',
    '__bool__', '__float__', '__int__', '__complex__', '__index__', '__len__',
    'shape', 'dtype', 'ndim', 'size', '__init__', '__new__', '__hash__',
    '__copy__', '__deepcopy__', '__format__', '__reduce__', '__reduce_ex__',   # tested in test_state_and_habits.py
}

# Entry points that are not operations either, each checked by a test below instead of a spec: in-place writes,
# refused with an error that names what to use instead, and piecewise-constant methods that give a plain result.
REFUSED = {   # entry point: (a call on traced x, words the error must contain)
    'Traced.sort': (lambda x: x.sort(), 'np.sort(x)'), 'Traced.partition': (lambda x: x.partition(1), 'np.partition(x, kth)'),
    'Traced.put': (lambda x: x.put([0], 1.0), 'fastad.put_along_axis'), 'Traced.fill': (lambda x: x.fill(0.0), 'np.full_like'),
    'numpy.put_along_axis': (lambda x: np.put_along_axis(x, np.array([0]), 1.0, 0), 'fastad.put_along_axis'),
    'numpy.copyto': (lambda x: np.copyto(np.zeros(3), x), 'np.broadcast_to'),
}
PLAIN_RESULTS = {   # entry point: (a call on traced x, the same call on plain arrays)
    'Traced.round': lambda x: x.round(1), 'Traced.searchsorted': lambda x: np.sort(x).searchsorted([0.2, 1.5]),
}

def traced_members():
    "Every function or property the traced value defines: its operators, methods and attributes."
    return {name for name, v in vars(engine.Traced).items()
            if isinstance(v, (property, staticmethod, classmethod)) or callable(v)} - {'__class__'}

def entry_points():
    "Every way user code reaches a derivative: NumPy ufuncs and functions the engine routes, traced members, fastad exports."
    points = {f"numpy.{f.__name__}" for f, row in P.REGISTRY.items() if row.primitive is not None}
    points |= {f"numpy.{f.__name__}" for f, row in P.REGISTRY.items() if row.adapt is not None}
    points |= {f"Traced.{name}" for name in traced_members() - NOT_OPERATIONS}
    points |= {f"fastad.{name}" for name in dir(fd) if isinstance(getattr(fd, name), P.Primitive)}
    points |= {f"fastad.primitives.{name}" for name in P.__all__
               if isinstance(getattr(P, name), P.Primitive) and not hasattr(fd, name)}
    return points

def all_primitives():
    "Every Primitive the primitives, engine and adapter modules define (user registrations aside)."
    found = set()
    modules = [P, engine] + [importlib.import_module(f"fastad.{i.name}") for i in pkgutil.iter_modules(fd.__path__)
                             if 'adapter' in i.name or i.name.startswith('primitives') or i.name == 'dispatch']
    for module in modules:
        for v in vars(module).values():
            for p in (v, getattr(v, 'primitive', None)):
                if type(p) is P.Primitive: found.add(p.name)
    found |= {row.primitive.name for row in P.REGISTRY.values() if type(row.primitive) is P.Primitive}
    return found

def test_every_entry_point_has_a_spec():
    covered = {c for s in SPECS for c in s.covers} | set(REFUSED) | set(PLAIN_RESULTS)
    missing = sorted(entry_points() - covered)
    assert not missing, f"no property spec for: {', '.join(missing)} (add one to SPECS in {__file__})"

# rules that wait for a domain, each named here until its module gives one (none now: every rule has one)
AWAITING_DOMAIN = set()

def test_every_rule_has_a_domain_its_tests_draw_from():
    "A rule without a domain, or with a drawer or value kind the tests lack, is named here."
    found = rules()
    missing = sorted(n for n, p in found.items() if p.domain is None and n not in AWAITING_DOMAIN)
    assert not missing, f"rules with no domain= (where their property tests draw inputs): {missing}"
    unknown = sorted(f"{n}: {domain_of(p)[0]}" for n, p in found.items() if p.domain is not None
                     and domain_of(p)[0] not in DERIVED.keys() | DRAWERS)
    assert not unknown, f"domains naming a drawer {__file__} lacks: {unknown}"
    kinds = sorted(f"{n}: {k}" for n, p in found.items() if p.domain is not None and domain_of(p)[0] == 'elementwise'
                   for k in domain_of(p)[1] if k not in KINDS)
    assert not kinds, f"elementwise domains naming a value kind KINDS lacks: {kinds}"
    stale = sorted(AWAITING_DOMAIN - {n for n, p in found.items() if p.domain is None})
    assert not stale, f"AWAITING_DOMAIN names rules that have a domain now: {stale}"

def test_a_rule_with_an_elementwise_domain_gets_its_spec():
    "Every ufunc whose rule says 'elementwise ...' is in SPECS, under its own name, drawing from its kinds."
    names = {s.name for s in SPECS}
    for f, row in P.REGISTRY.items():
        if type(row.primitive) is P.Primitive and row.primitive.domain and domain_of(row.primitive)[0] in DERIVED:
            assert f"np.{f.__name__}" in names, f.__name__

def test_not_operations_are_still_members():
    "The exclusion list stays honest: every name in it is a member of the traced value."
    stale = sorted(NOT_OPERATIONS - traced_members() - {'__init__', '__new__', '__hash__'})
    assert not stale, f"NOT_OPERATIONS names members the traced value no longer has: {stale}"

def test_every_primitive_runs_forward_and_backward_under_the_specs():
    "Run each spec on a few draws under the primitive log: every Primitive must show up, forward and pullback."
    seen = set()
    @given(st.data())
    @settings(max_examples=6, **CHECKS)
    def run(s, data):
        xs, kw = s.draw(data)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            with fd.trace_primitives() as log:
                f = lambda *a: s.fn(*a, **kw)
                value, pb = fd.value_with_pullback(f, *xs)
                v = np.ones(np.shape(value))
                pb(v)
                if s.second_order: fd.gradient(weighted_gradient(f, xs, v, [np.ones(x.shape) for x in xs]), *xs)
        seen.update((phase, name) for phase, name in log.counts)
    for s in SPECS: run(s)
    for phase in ('forward', 'pullback'):
        missing = sorted(all_primitives() - {name for p, name in seen if p == phase})
        assert not missing, f"primitives never run {phase} by any spec: {missing}"

@pytest.mark.parametrize('name', REFUSED)
def test_in_place_members_are_refused_naming_the_alternative(name):
    call, words = REFUSED[name]
    with pytest.raises(DifferentiationError, match='in place') as e: fd.gradient(lambda x: call(x) or x.sum(), np.linspace(0.1, 1, 3))
    assert words in str(e.value), str(e.value)

@pytest.mark.parametrize('name', PLAIN_RESULTS)
def test_piecewise_constant_members_give_plain_results(name):
    "Their value is the plain one, untraced: `f(x) * x` has gradient f(x), f itself contributing nothing."
    f, x = PLAIN_RESULTS[name], np.array([-1.26, 0.31, 1.77])
    seen = []
    def use(y):
        r = f(y)
        seen.append(type(r))
        return np.sum(r * y[:np.size(r)])
    g = fd.gradient(use, x)
    assert seen == [np.ndarray], seen
    np.testing.assert_array_equal(g[:np.size(f(x))], f(x))

# --- the checks ---------------------------------------------------------------------------------------------------
def on_device(obj):
    "Arrays and NumPy scalars (also inside tuples and dicts) moved to the active backend's device; all else as is."
    if isinstance(obj, (np.ndarray, np.generic)): return to_device(obj)
    if isinstance(obj, tuple): return tuple(on_device(o) for o in obj)
    if isinstance(obj, dict): return {k: on_device(v) for k, v in obj.items()}
    return obj

def inner(a, b): return float(sum(np.sum(to_host(x) * to_host(y)) for x, y in zip(a, b)))

def same_kind(value, plain):
    "Same shape, dtype and array module (a 0-d array and a NumPy scalar count as the same kind)."
    assert np.shape(value) == np.shape(plain) and np.result_type(value) == np.result_type(plain), (value, plain)
    assert array_module(value) is array_module(plain), (type(value), type(plain))

def plain_call(s, xs, kw):
    """`s.fn` on the drawn (host) arrays, without fastad: the reference. Under the NumPy backend, on them; under
    the others it runs on the host, under NumPy, and its value is moved to the device: CuPy lacks some of the
    functions tested here (`np.block`, `take(mode=)`, `np.linalg.trace`, ...), and the strict backend stands in
    for CuPy. So fastad on the device is checked against NumPy itself."""
    if get_backend() == 'numpy': return s.fn(*xs, **kw)
    with use_backend('numpy'): value = s.fn(*xs, **kw)
    return on_device(value)

def check_first_order(s, xs, kw, seed):
    "Value, pullback against central differences, pullback twice, the caller's cotangent untouched, types kept."
    rng = np.random.default_rng(seed)
    plain = plain_call(s, xs, kw)
    hosts, host_kw, xs, kw = xs, kw, [to_device(x) for x in xs], on_device(kw)
    f = lambda *a: s.fn(*a, **kw)
    value, pb = fd.value_with_pullback(f, *xs)
    same_kind(value, plain)
    if s.exact and get_backend() != 'cupy': np.testing.assert_array_equal(to_host(value), to_host(plain))
    else: np.testing.assert_allclose(to_host(value), to_host(plain), rtol=1e-12, atol=1e-12)   # CuPy's kernels round their own way
    v_host = rng.standard_normal(np.shape(to_host(value)))
    v = to_device(v_host)
    grads = pb(v)
    grads = grads if len(xs) > 1 else (grads,)
    np.testing.assert_array_equal(to_host(v), v_host)                     # the caller's cotangent, unchanged
    again = pb(v)
    for g, h in zip(grads, again if len(xs) > 1 else (again,)):
        if get_backend() != 'cupy': np.testing.assert_array_equal(to_host(g), to_host(h))
        else: np.testing.assert_allclose(to_host(g), to_host(h), rtol=1e-13, atol=1e-13)   # CuPy's add.at sums in any order
    for i, (x, g) in enumerate(zip(xs, grads)):
        assert type(g) is type(x) and g.shape == x.shape and g.dtype == x.dtype, (i, type(g), g.shape, g.dtype)
    for _ in range(2):                                                    # two random directions, all inputs at once
        ds = [rng.standard_normal(np.shape(x)) for x in xs]
        def along(t):                                                     # the plain function, on the host's arrays
            with use_backend('numpy'): return inner([v_host], [s.fn(*(x + t * d for x, d in zip(hosts, ds)), **host_kw)])
        numeric = (along(EPS) - along(-EPS)) / (2 * EPS)
        analytic = inner(grads, ds)
        assert abs(analytic - numeric) <= RTOL * max(1.0, abs(numeric)), (s.name, analytic, numeric)

# The two whole sweeps below run every spec on NumPy in the default run, and again on the other backends under `slow`
# (the other backends' own checks, such as test_casts_between_precisions_keep_the_argument_dtype, run by default).
SWEEP_BACKENDS = ['numpy'] + [pytest.param(b, marks=pytest.mark.slow) for b in ['strict'] + (['cupy'] if gpu_available() else [])]

@pytest.fixture(params=SWEEP_BACKENDS)
def sweep_backend(request):
    "Each backend in turn, as `any_backend` gives them; all but NumPy only under `slow`."
    with use_backend(request.param) as xp: yield xp

@pytest.mark.parametrize('s', SPECS, ids=[s.name for s in SPECS])
@given(data=st.data())
@settings(max_examples=10, **CHECKS)
def test_gradient_against_central_differences(sweep_backend, s, data):
    if s.host_only and sweep_backend is not np: pytest.skip("a host constant: NumPy backend only")
    xs, kw = s.draw(data)
    check_first_order(s, xs, kw, data.draw(st.integers(0, 2**32 - 1), label='seed'))

def weighted_gradient(f, xs, v, ds):
    "<d, pullback(v)> as a function of xs, computed through fastad (traced inside an outer transform)."
    def h(*a):
        g = fd.pullback(f, *a)(v)
        g = g if len(a) > 1 else (g,)
        return sum((gi * di).sum() for gi, di in zip(g, ds)) * 1.0
    return h

@pytest.mark.parametrize('s', [s for s in SPECS if s.second_order], ids=[s.name for s in SPECS if s.second_order])
@given(data=st.data())
@settings(max_examples=5, **CHECKS)
def test_second_order_against_central_differences(s, data):
    "The pullback differentiated again: <e, grad_x <d, pullback(v)>> against central differences of the first order."
    xs, kw = s.draw(data)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label='seed'))
    f = lambda *a: s.fn(*a, **kw)
    v = rng.standard_normal(np.shape(f(*xs)))
    ds, es = ([rng.standard_normal(x.shape) for x in xs] for _ in range(2))
    h = weighted_gradient(f, xs, v, ds)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', fd.ZeroDerivativeWarning)          # a linear op: its pullback is constant
        hv = fd.gradient(h, *xs)
    hv = hv if len(xs) > 1 else (hv,)
    numeric = (float(h(*(x + EPS * e for x, e in zip(xs, es)))) - float(h(*(x - EPS * e for x, e in zip(xs, es))))) / (2 * EPS)
    analytic = inner(hv, es)
    assert abs(analytic - numeric) <= SECOND_RTOL * max(1.0, abs(numeric)), (s.name, analytic, numeric)

@pytest.mark.parametrize('s', SPECS, ids=[s.name for s in SPECS])
@given(data=st.data())
@settings(max_examples=4, **CHECKS)
def test_float32_in_float32_out(sweep_backend, s, data):
    "float32 inputs: the value has the plain call's dtype (float32 unless a float64 constant joins), gradients are float32."
    if s.host_only and sweep_backend is not np: pytest.skip("a host constant: NumPy backend only")
    xs, kw = s.draw(data)
    xs = [x.astype(np.float32) for x in xs]
    plain = plain_call(s, xs, kw)
    xs, host_kw, kw = [to_device(x) for x in xs], kw, on_device(kw)
    f = lambda *a: s.fn(*a, **kw)
    value, pb = fd.value_with_pullback(f, *xs)
    assert value.dtype == plain.dtype, (value.dtype, plain.dtype)
    if (not any(isinstance(c, (list, np.ndarray)) for c in host_kw.values()) and 'dtype' not in kw
            and not s.float64_value):
        assert value.dtype == np.float32, value.dtype                    # Python-number constants never promote
    grads = pb(to_device(np.ones(np.shape(to_host(value)), value.dtype)))
    for x, g in zip(xs, grads if len(xs) > 1 else (grads,)):
        assert type(g) is type(x) and g.dtype == np.float32 and g.shape == x.shape, (type(g), g.dtype, g.shape)

def test_casts_between_precisions_keep_the_argument_dtype(any_backend):
    x32, x64 = to_device(np.ones(3, np.float32)), to_device(np.ones(3))
    value, g = fd.value_with_gradient(lambda x: (x.astype(np.float64) * 2.0).sum(), x32)
    assert value.dtype == np.float64 and g.dtype == np.float32 and type(g) is type(x32)
    value, g = fd.value_with_gradient(lambda x: (x.astype(np.float32) * 2.0).sum(), x64)
    assert value.dtype == np.float32 and g.dtype == np.float64 and type(g) is type(x64)

SCALAR_SPECS = [s for s in SPECS if s.scalars]

@pytest.mark.parametrize('s', SCALAR_SPECS, ids=[s.name for s in SCALAR_SPECS])
@given(data=st.data())
@settings(max_examples=4, **CHECKS)
def test_python_floats_and_numpy_scalars_keep_their_type(s, data):
    "A float in gives a float gradient; a NumPy float32 scalar a float32 scalar; the value is the plain call's."
    xs, kw = s.draw(data)
    xs = [float(x.flat[0]) if x.size else 1.0 for x in xs]
    kw = {k: float(np.ravel(v)[0]) if isinstance(v, np.ndarray) and v.size else v for k, v in kw.items()}
    assume(all(np.isfinite(x) for x in xs))
    f = lambda *a: s.fn(*a, **kw)
    for cast in (float, np.float64, np.float32):
        args = [cast(x) for x in xs]
        value, grads = fd.value_with_gradient(f, *args)
        plain = f(*args)
        assert value == plain and np.result_type(value) == np.result_type(plain), (cast, value, plain)
        for g in (grads if len(args) > 1 else (grads,)): assert type(g) is cast, (cast, type(g))

# --- random programs ----------------------------------------------------------------------------------------------
# Each op takes values already computed (by index) and gives a new one; every op is smooth on every input it can
# meet (bounded arguments for exp, log of 1 + x^2, ...), so programs need no domain checks and second order works.
# Shapes: inputs are (m, n) and, for the second one, broadcastable to it; keepdims reductions make size-1 axes.
def full(x, shape): return np.broadcast_to(x, shape) if np.shape(x) != shape else x
OPS = {
    'sin': (1, lambda s, a: np.sin(a)), 'tanh': (1, lambda s, a: np.tanh(a)), 'exp(tanh)': (1, lambda s, a: np.exp(np.tanh(a))),
    'log(1+x^2)': (1, lambda s, a: np.log(1.0 + a * a)), 'sqrt(1+x^2)': (1, lambda s, a: np.sqrt(np.square(a) + 1.0)),
    'x**3': (1, lambda s, a: a ** 3), 'neg': (1, lambda s, a: -a), 'expm1(sin)': (1, lambda s, a: np.expm1(np.sin(a))),
    'add': (2, lambda s, a, b: a + b), 'sub': (2, lambda s, a, b: np.subtract(a, b)), 'mul': (2, lambda s, a, b: a * b),
    'div': (2, lambda s, a, b: a / (1.5 + np.cos(b))), 'pow': (2, lambda s, a, b: (1.2 + np.sin(a)) ** b),
    'sum0': (1, lambda s, a: a.sum(axis=0, keepdims=True)), 'mean-1': (1, lambda s, a: np.mean(a, axis=-1, keepdims=True)),
    'lse': (1, lambda s, a: fd.logsumexp(a, axis=-1, keepdims=True)), 'log_softmax0': (1, lambda s, a: fd.log_softmax(full(a, s), axis=0)),
    'flip': (1, lambda s, a: a[::-1]), 'T.T': (1, lambda s, a: np.transpose(a).T),
    'reshape': (1, lambda s, a: full(a, s).reshape(-1).reshape(s)),
    'matmul': (3, lambda s, a, b, c: full(a, s) @ (full(b, s).T @ full(c, s)) / 4.0),
    'concat-slice': (2, lambda s, a, b: np.concatenate([full(a, s), full(b, s)], axis=1)[:, ::2][:, :s[1]] if s[1] else full(a, s)),
    'stack-sum': (2, lambda s, a, b: np.stack([full(a, s), full(b, s)]).sum(0)),
    'where': (2, lambda s, a, b: np.where(np.arange(s[1]) % 2 == 0, a, b)),
    'einsum': (2, lambda s, a, b: np.einsum('ij,ij->ij', full(a, s), full(b, s))), 'var': (1, lambda s, a: full(a, s).var(axis=0, keepdims=True) + 0.0),
}

@st.composite
def programs(draw):
    "A random program: 1-2 inputs, then 2-5 ops, each reading any earlier values; the result sums every value."
    m, n = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n_inputs = draw(st.integers(1, 2))
    second = draw(st.sampled_from([(m, n), (n,), (1, n), (m, 1)]))
    steps = []
    for k in range(draw(st.integers(2, 5))):
        name = draw(st.sampled_from(sorted(OPS)))
        steps.append((name, [draw(st.integers(0, n_inputs + k - 1)) for _ in range(OPS[name][0])]))
    return (m, n), [(m, n), second][:n_inputs], steps

def run_program(shape, steps):
    def f(*xs):
        vals = list(xs)
        for name, args in steps: vals.append(OPS[name][1](shape, *(vals[i] for i in args)))
        return sum(np.sum(v * (i + 1.0) / 7.0) for i, v in enumerate(vals[len(xs):]))   # every op's value counts
    return f

@given(program=programs(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=150, **CHECKS)
def test_random_programs_against_central_differences(program, seed):
    shape, input_shapes, steps = program
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(-1.5, 1.5, s) for s in input_shapes]
    f = run_program(shape, steps)
    value, grads = fd.value_with_gradient(f, *xs)
    np.testing.assert_allclose(value, f(*xs), rtol=1e-12)
    grads = grads if len(xs) > 1 else (grads,)
    ds = [rng.standard_normal(s) for s in input_shapes]
    numeric = (f(*(x + EPS * d for x, d in zip(xs, ds))) - f(*(x - EPS * d for x, d in zip(xs, ds)))) / (2 * EPS)
    analytic = inner(grads, ds)
    assert abs(analytic - numeric) <= RTOL * max(1.0, abs(numeric)), (steps, analytic, numeric)

@given(program=programs(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, **CHECKS)
def test_random_programs_second_order(program, seed):
    "A Hessian-vector product of the program (gradient of <grad f, d>) against central differences of grad f."
    shape, input_shapes, steps = program
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(-1.5, 1.5, s) for s in input_shapes]
    f = run_program(shape, steps)
    ds, es = ([rng.standard_normal(s) for s in input_shapes] for _ in range(2))
    def directional(*a):
        g = fd.gradient(f, *a)
        return sum(np.sum(gi * di) for gi, di in zip(g if len(a) > 1 else (g,), ds)) * 1.0
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', fd.ZeroDerivativeWarning)         # a linear program: constant gradient
        hv = fd.gradient(directional, *xs)
    numeric = (directional(*(x + EPS * e for x, e in zip(xs, es))) - directional(*(x - EPS * e for x, e in zip(xs, es)))) / (2 * EPS)
    analytic = inner(hv if len(xs) > 1 else (hv,), es)
    assert abs(analytic - numeric) <= SECOND_RTOL * max(1.0, abs(numeric)), (steps, analytic, numeric)

@given(program=programs(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=40, **CHECKS)
def test_random_programs_pullback_twice_and_value(program, seed):
    "The pullback of a whole program: callable twice with one answer, the cotangent untouched, the value the plain one."
    shape, input_shapes, steps = program
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(-1.5, 1.5, s) for s in input_shapes]
    f = run_program(shape, steps)
    value, pb = fd.value_with_pullback(f, *xs)
    assert value == f(*xs) and type(value) is type(f(*xs))
    v = np.float64(rng.standard_normal())
    first, second = pb(v), pb(v)
    for a, b in zip(first if len(xs) > 1 else (first,), second if len(xs) > 1 else (second,)):
        np.testing.assert_array_equal(a, b)
