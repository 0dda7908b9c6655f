"""Known ways to get a wrong number, or a raw error, each asserting the right behaviour.

The ones that fail today are marked `xfail(strict=True)` with the bug in one line: the suite stays green, and the
mark must come off (the test then passes) the moment the fix lands. Each test is its own minimal reproduction.
"""
import dataclasses
import numpy as np, pytest
import fastad as fd
from fastad.errors import FastADError, DifferentiationError

def close(a, b, tol=1e-9): np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)

def refused_as_complex(f):
    "A complex intermediate is refused with a fastad error that says so: never a silently wrong number."
    with pytest.raises(DifferentiationError, match='complex'): f()

# --- complex intermediates --------------------------------------------------------------------------------------
def test_complex_product_then_abs():
    refused_as_complex(lambda: fd.gradient(lambda x: np.abs(x * (1 + 1j)), 2.0))

def test_astype_complex_then_abs():
    refused_as_complex(lambda: fd.gradient(lambda x: np.abs(x.astype(complex) * (1 + 1j)).sum(), np.array([2.0])))

# --- custom derivatives and trace levels ----------------------------------------------------------------------------
def safe_log_vjp(x): return np.log(x), lambda g: g / np.maximum(x, 1e-3)

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

# --- models ------------------------------------------------------------------------------------------------------------
def test_a_field_derived_in_post_init_is_differentiated():
    class Doubled(fd.Differentiable):
        w: np.ndarray
        def __post_init__(self): self.cache = self.w * 2
    close(fd.gradient(lambda m: (m.cache * m.w).sum(), Doubled(np.ones(3))).w, [4.0, 4.0, 4.0])   # d/dw 2 w^2

def test_frozen_models():
    @dataclasses.dataclass(frozen=True)
    class Frozen(fd.Differentiable):
        w: np.ndarray
    g = fd.gradient(lambda m: (m.w ** 2).sum(), Frozen(np.ones(3)))
    assert type(g) is Frozen
    close(g.w, [2.0, 2.0, 2.0])

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
