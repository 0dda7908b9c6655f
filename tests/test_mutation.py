"""In-place writes on traced arrays (`x op= y`, `x[key] = v`, `x[key] op= v`): NumPy's values, and derivatives in
forward mode (`differential`, `value_with_differential`) and at second order (`hessian`, `hessian_vector_product`,
forward over reverse), each checked against float64 central differences of the same code run by NumPy. A write
the engine cannot make right must be refused, never silently wrong."""
import numpy as np, pytest
import fastad as fd
from fastad.testing import numerical_gradient
from fastad.errors import DifferentiationError
from fastad.backend import to_device, to_host
from hypothesis import given, settings, strategies as st, HealthCheck
from engine_helpers import numerical_jacobian

def close(a, b, tol=1e-6): np.testing.assert_allclose(a, b, rtol=tol, atol=tol)

# --- the write patterns: each a function of a vector x of length 4, run by NumPy as it is ----------------------------
def alias_add(x):
    "w = v; w += 1: both names see the write."
    v = x * 1.0
    w = v
    w += 1
    return v * w

def argument_add(x):
    "x += 1 on the argument itself."
    x += 1.0
    return x * x

def view_mul(x):
    "z = y[:1]; z *= 3: a write through a view (NumPy changes y)."
    y = x * 1.0
    z = y[:1]
    z *= 3
    return y

def view_set(x):
    "z = y[:2]; z[0] = v: an item written through a view (NumPy changes y)."
    y = x * 1.0
    z = y[:2]
    z[0] = x[1] * 3
    return y

def set_item(x):
    "y[i] = v."
    y = x * 1.0
    y[2] = np.sin(x[0]) * x[3]
    return y * x

def set_slice(x):
    "y[1:] = x[:3] * 2."
    y = x ** 2
    y[1:] = x[:3] * 2
    return y * x

def set_mask(x):
    "y[mask] = 0: the places are picked by the value."
    y = np.exp(x)
    y[x > 0.3] = 0
    return y * x

def add_repeated(x):
    "y[idx] += v with a repeated index: NumPy's value is one write per place, not a sum."
    y = x ** 2
    y[np.array([0, 0, 3])] += x[1:] * x[0]
    return y

def layer_norm(x):
    "c -= c.mean(); c /= its scale: a layer norm written in place."
    c = x * np.array([1.0, 2.0, -0.5, 1.5])
    c -= c.mean()
    c /= np.sqrt((c * c).mean() + 1e-5)
    return c * c * c + c

def recurrence(x):
    "y[i] = f(y[i-1]): each place written from the one before it."
    y = x * 1.0
    for i in range(1, 4): y[i] = np.tanh(y[i - 1]) * x[i] + y[i]
    return y

def saved_then_written(x):
    "h's old value is needed by h * h's derivative, then h is written in place."
    h = x * x
    s = h * h
    h[0] = 0.0
    h += x
    return s + h

WORKING = [alias_add, argument_add, set_item, set_slice, set_mask, add_repeated, layer_norm, recurrence, saved_then_written]
X = np.array([0.7, -0.4, 1.1, 0.25])
WEIGHTS = np.array([1.0, -2.0, 0.5, 1.5])

def numpy_value(form, x): return form(np.array(x, dtype=np.float64))          # a fresh copy: the form may write it

def loss_of(form):
    "A nonlinear scalar of the form's result, so its Hessian has something to say."
    return lambda x: (np.sin(form(x)) * WEIGHTS).sum()

# --- values and first order ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('form', WORKING, ids=lambda f: f.__name__)
def test_values_match_numpy_and_reverse_mode_matches_central_differences(form):
    value, grad = fd.value_with_gradient(loss_of(form), X.copy())
    close(value, loss_of(form)(X.copy()), 1e-12)
    close(grad, numerical_gradient(lambda x: loss_of(form)(x.copy()), X))

@pytest.mark.parametrize('form', WORKING, ids=lambda f: f.__name__)
def test_forward_mode_matches_central_differences(form):
    jac = numerical_jacobian(lambda x: numpy_value(form, x), X)
    value, d = fd.value_with_differential(form, X.copy())
    close(value, numpy_value(form, X), 1e-12)
    for t in [np.eye(4)[0], np.eye(4)[3], np.array([1.0, -0.5, 2.0, 0.3])]:
        close(d(t), jac @ t)
    close(fd.differential(loss_of(form), X.copy())(WEIGHTS), numerical_gradient(lambda x: loss_of(form)(x.copy()), X) @ WEIGHTS)

def test_the_callers_array_is_not_written():
    x = X.copy()
    for form in WORKING:
        fd.gradient(loss_of(form), x); fd.differential(form, x)(np.ones(4)); fd.hessian(loss_of(form), x)
    np.testing.assert_array_equal(x, X)

# --- second order ------------------------------------------------------------------------------------------------------------------
def numerical_hessian(loss, x, eps=1e-4):
    "Central differences of central differences, in float64: fastad's gradient plays no part."
    g = lambda x: numerical_gradient(lambda y: loss(y.copy()), x, eps=eps)
    return numerical_jacobian(g, x, eps=eps)

@pytest.mark.parametrize('form', WORKING, ids=lambda f: f.__name__)
def test_hessian_and_its_products_match_central_differences(form):
    loss = loss_of(form)
    want = numerical_hessian(loss, X)
    hess = fd.hessian(loss, X.copy())
    close(hess, want, 1e-5)
    v = np.array([0.5, -1.0, 0.25, 2.0])
    close(fd.hessian_vector_product(loss, X.copy(), v), want @ v, 1e-5)
    close(fd.differential(lambda x: fd.gradient(loss, x), X.copy())(v), want @ v, 1e-5)     # forward over reverse

# --- the values of the patterns the issue names, by hand ---------------------------------------------------------------------
def test_the_issues_examples_by_hand():
    def shifted(v):
        w = v
        w += 1
        return (v * w).sum()
    value, g = fd.value_with_gradient(shifted, np.array([1.0, 2.0]))
    assert value == 13.0
    close(g, 2 * (np.array([1.0, 2.0]) + 1), 0)
    value, d = fd.value_with_differential(shifted, np.array([1.0, 2.0]))
    assert value == 13.0 and d(np.array([1.0, 0.0])) == 4.0
    close(fd.hessian(shifted, np.array([1.0, 2.0])), 2 * np.eye(2), 0)

def test_a_write_through_a_view_is_right_or_refused():
    "z = y[:1]; z *= 3 changes y in NumPy: fastad gives NumPy's value and derivatives, or refuses; never y unchanged."
    x = np.array([1.0, 2.0, 0.5, -1.0])
    try: value, g = fd.value_with_gradient(lambda x: view_mul(x).sum(), x)
    except DifferentiationError as e:
        assert 'shares memory' in str(e) and 'x = x * y' in str(e), str(e)
        with pytest.raises(DifferentiationError, match='shares memory'): fd.differential(view_mul, x)(np.ones(4))
        with pytest.raises(DifferentiationError, match='shares memory'): fd.hessian(lambda x: (view_mul(x) ** 2).sum(), x)
        return
    assert value == 8.5 == numpy_value(view_mul, x).sum()
    close(g, [3.0, 1.0, 1.0, 1.0], 0)
    close(fd.differential(view_mul, x)(np.ones(4)), [3.0, 1.0, 1.0, 1.0], 0)

def test_a_write_after_reading_a_slice_of_the_same_array_is_right_or_refused():
    "y[1:] = y[:-1] * 2 (NumPy reads the old y, then writes): NumPy's value and derivatives, or a refusal that says so."
    def shift(x):
        y = x * 1.0
        y[1:] = y[:-1] * 2
        return y * x
    x = np.array([0.5, 1.2, -0.7, 0.3])
    try: value, d = fd.value_with_differential(shift, x)
    except DifferentiationError as e:
        assert 'shares memory' in str(e) and 'x.copy()' in str(e), str(e)
        return
    close(value, numpy_value(shift, x), 0)
    close(np.stack([d(e) for e in np.eye(4)], axis=1), numerical_jacobian(lambda x: numpy_value(shift, x), x))

ON_DEVICE = [alias_add, argument_add, set_item, set_slice, set_mask, recurrence, saved_then_written, view_mul,
             view_set]                                                   # no host constants

@pytest.mark.parametrize('form', ON_DEVICE, ids=lambda f: f.__name__)
def test_on_a_device_backend_every_write_is_right_or_refused(strict_backend, form):
    "On the strict backend (arrays that are not NumPy's, as CuPy's): NumPy's value and gradient, or a refusal."
    x = np.array([1.0, 2.0, 0.5, -1.0])
    loss = lambda x, w: (form(x) * w).sum()
    try: value, g = fd.value_with_gradient(loss, to_device(x), to_device(WEIGHTS), argnums=0)
    except DifferentiationError as e:
        assert 'shares memory' in str(e), str(e)
        return
    close(to_host(value), loss(x.copy(), WEIGHTS), 1e-12)
    close(to_host(g), numerical_gradient(lambda x: loss(x.copy(), WEIGHTS), x))

def test_repeated_indices_keep_numpys_value_not_a_sum():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y = numpy_value(add_repeated, x)
    assert y[0] == 1.0 + 3.0 * 1.0                # the last write to place 0 survives: x[2] * x[0] added once
    close(fd.value_with_differential(add_repeated, x)[0], y, 0)
    jac = numerical_jacobian(lambda x: numpy_value(add_repeated, x), x)
    close(fd.jacobian(add_repeated, x), jac)
    close(np.stack([fd.differential(add_repeated, x)(e) for e in np.eye(4)], axis=1), jac)

# --- random inputs, writes and keys --------------------------------------------------------------------------------------------------
keys = st.one_of(st.integers(-4, 3), st.slices(4),
                 st.lists(st.integers(0, 3), min_size=1, max_size=4).map(np.array),
                 st.lists(st.booleans(), min_size=4, max_size=4).map(np.array))

@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(key=keys, op=st.sampled_from(['=', '+=', '*=']), x=st.lists(st.floats(-1.5, 1.5), min_size=4, max_size=4).map(np.array))
def test_random_writes_match_numpy_in_forward_mode_and_at_second_order(key, op, x):
    def form(x):
        y = np.cos(x) * x
        v = np.sin(x[key]) * x[key] + 1.0           # from x: a slice of y read first is another matter (below)
        if op == '=': y[key] = v
        elif op == '+=': y[key] += v
        else: y[key] *= v
        return y * x
    try: value, d = fd.value_with_differential(form, x.copy())
    except DifferentiationError as e:               # y[a:b] op= v: Python writes into the view y[a:b] first
        assert isinstance(key, slice) and op != '=' and 'shares memory' in str(e), (key, op, str(e))
        return
    close(value, numpy_value(form, x), 1e-12)
    jac = numerical_jacobian(lambda x: numpy_value(form, x), x)
    close(np.stack([d(e) for e in np.eye(4)], axis=1), jac, 1e-5)
    loss = lambda x: (form(x) ** 2 * WEIGHTS).sum()
    close(fd.hessian(loss, x.copy()), numerical_hessian(loss, x), 1e-4)

@pytest.mark.parametrize('op', ['+=', '-=', '*='])
def test_an_augmented_write_into_a_slice_is_right_or_refused(op):
    "y[1:] op= v is y[1:] = y[1:] op v in NumPy: its value and derivatives, or a refusal that names the write."
    def form(x):
        y = x * x
        if op == '+=': y[1:] += x[:3]
        elif op == '-=': y[1:] -= x[:3]
        else: y[1:] *= x[:3]
        return y
    try: value, d = fd.value_with_differential(form, X.copy())
    except DifferentiationError as e:
        assert f'x {op} y' in str(e) and 'shares memory' in str(e), str(e)
        return
    close(value, numpy_value(form, X), 1e-12)
    close(np.stack([d(e) for e in np.eye(4)], axis=1), numerical_jacobian(lambda x: numpy_value(form, x), X))
