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
from fastad.engine import is_traced
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

def shift(x):
    "y[1:] = y[:-1] * 2: NumPy computes the right side from the old y, then writes."
    y = x * 1.0
    y[1:] = y[:-1] * 2
    return y * x

def slice_add(x):
    "y[1:] += v: Python reads the view y[1:], adds into it (which writes y), then sets y[1:] to it."
    y = x * x
    y[1:] += x[:3]
    y[:2] *= x[2:]
    return y

def base_with_live_view(x):
    "z = y[1:3]; y *= x; y[0] = v: z, a live view, sees both writes."
    y = x * 1.0
    z = y[1:3]
    y *= x
    y[1] = np.sin(x[0])
    z -= 0.5 * x[3]
    return y * (1.0 + z.sum())

def base_with_live_reshape(x):
    "m = y.reshape(2, 2); y[0] = v: m, a live view of another kind, is taken again from the new y."
    y = x * 1.0
    m = y.reshape(2, 2).T
    y[0] = x[3] * 2
    return y * m.ravel()

def view_of_view(x):
    "z = y[1:][:2]; z *= v: through the dropped y[1:] into y; w = y[2:], alive, sees it."
    y = x * 1.0
    w = y[2:]
    z = y[1:][:2]
    z *= x[:2]
    return y + w.sum()

def masked_copy(x):
    "out = np.zeros_like(x); out[m] = g[m]: the pullback pattern, in a function."
    out = np.zeros_like(x)
    m = x > 0.3
    out[m] = np.sin(x[m]) * x[m]
    ones = np.ones_like(x)
    ones[:2] = x[2:] ** 2
    filled = np.full_like(x, 0.5)
    filled[1:3] *= x[:2]
    spare = np.empty_like(x)
    spare[...] = x * 3
    return out + ones * filled + spare

def add_at(x):
    "np.add.at: a repeated index adds every value (unlike y[idx] += v); np.subtract.at likewise."
    y = x ** 2
    np.add.at(y, [0, 0, 3], x[1:] * x[0])            # (a list: an index on any backend)
    np.subtract.at(y, ([1, 1],), 0.5 * x[2])
    return y

def saved_then_written(x):
    "h's old value is needed by h * h's derivative, then h is written in place."
    h = x * x
    s = h * h
    h[0] = 0.0
    h += x
    return s + h

WORKING = [alias_add, argument_add, view_mul, view_set, set_item, set_slice, set_mask, add_repeated, shift, slice_add,
           base_with_live_view, base_with_live_reshape, view_of_view,
           masked_copy, add_at, layer_norm, recurrence, saved_then_written]
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
def test_under_jit_every_write_matches_eager_mode(form):
    "jit's Tracer stands under the traced values: a write through a view must still reach its base (trace, trace, replay)."
    loss = loss_of(form)
    value, grad = fd.value_with_gradient(loss, X.copy())
    g = fd.jit(fd.gradient(loss))
    vg = fd.jit(lambda x: fd.value_with_gradient(loss, x))
    for _ in range(3):
        close(g(X.copy()), grad, 1e-12)
        v, gr = vg(X.copy())
        close(v, value, 1e-12); close(gr, grad, 1e-12)

def _view_times_three(x): y = x * 1.0; z = y[:1]; z *= 3; return y.sum()
def _view_item_times_three(x): y = x * 1.0; z = y[:1]; z[0] = 3 * z[0]; return y.sum()
def _base_written_under_a_live_view(x): y = x * 1.0; z = y[:1]; y *= 3; return z.sum()

@pytest.mark.parametrize('f, value, grad', [(_view_times_three, 5.0, [3, 1]), (_view_item_times_three, 5.0, [3, 1]),
                                            (_base_written_under_a_live_view, 3.0, [3, 0])], ids=lambda a: getattr(a, '__name__', ''))
def test_under_jit_a_write_through_a_view_keeps_its_value_and_gradient(f, value, grad):
    x = np.array([1., 2.])
    close(fd.gradient(f, x), grad)
    g, vg = fd.jit(fd.gradient(f)), fd.jit(lambda x: fd.value_with_gradient(f, x))
    for _ in range(3):                                # two traces, then the replay
        close(g(x), grad)
        v, gr = vg(x)
        close(v, value); close(gr, grad)

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

def test_a_write_through_a_view_reaches_its_base():
    "z = y[:1]; z *= 3 changes y in NumPy: the issue's example, [1, 2] gives 5.0 and the gradient [3, 1]."
    value, g = fd.value_with_gradient(lambda x: view_mul(x).sum(), np.array([1.0, 2.0]))
    assert value == 5.0
    close(g, [3.0, 1.0], 0)
    x = np.array([1.0, 2.0, 0.5, -1.0])
    close(fd.differential(view_mul, x)(np.ones(4)), [3.0, 1.0, 1.0, 1.0], 0)

def test_a_view_that_is_no_longer_held_does_not_block_a_write():
    "y[1:] = y[:-1] * 2 (the view y[:-1] is gone once read) and y[1:] += v (Python's view write, then y[1:] = it)."
    def reread(x):
        y = x * 1.0
        tail = y[1:]
        del tail                                    # dropped: y is no one else's memory
        y[0] = x[1]
        return y
    close(fd.jacobian(reread, X.copy()), numerical_jacobian(lambda x: numpy_value(reread, x), X))

def test_a_sharing_a_write_cannot_follow_is_refused_with_the_line_and_the_alternative():
    "A write into a transpose or a reshape of an array still alive: refused, naming the user's line and what to write."
    def transposed(x):
        y = np.outer(x, x)
        t = y.T
        t += 1.0                                    # NumPy changes y too
        return y + t
    def into_a_reshape(x):
        y = x * 1.0
        m = y.reshape(2, 2)
        m[0] = 5.0                                  # NumPy changes y too
        return m.sum() + y.sum()
    for f, line in [(transposed, 't += 1.0'), (into_a_reshape, 'm[0] = 5.0')]:
        with pytest.raises(DifferentiationError, match='shares memory') as e: fd.gradient(lambda x: f(x).sum(), X.copy())
        assert line in str(e.value) and 'test_mutation.py' in str(e.value) and 'copy' in str(e.value), str(e.value)

ON_DEVICE = [alias_add, argument_add, set_item, set_slice, set_mask, recurrence, saved_then_written, view_mul,
             view_set, shift, slice_add, base_with_live_view, base_with_live_reshape,
             view_of_view, masked_copy, add_at]             # no host constants

@pytest.mark.parametrize('form', ON_DEVICE, ids=lambda f: f.__name__)
def test_on_a_device_backend_every_write_is_right(strict_backend, form):
    "On the strict backend (arrays that are not NumPy's, as CuPy's): NumPy's value and gradient, views included."
    x = np.array([1.0, 2.0, 0.5, -1.0])
    loss = lambda x, w: (form(x) * w).sum()
    value, g = fd.value_with_gradient(loss, to_device(x), to_device(WEIGHTS), argnums=0)
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
    value, d = fd.value_with_differential(form, x.copy())   # y[a:b] op= v too: the view's write reaches y
    close(value, numpy_value(form, x), 1e-12)
    jac = numerical_jacobian(lambda x: numpy_value(form, x), x)
    close(np.stack([d(e) for e in np.eye(4)], axis=1), jac, 1e-5)
    loss = lambda x: (form(x) ** 2 * WEIGHTS).sum()
    close(fd.hessian(loss, x.copy()), numerical_hessian(loss, x), 1e-4)

@pytest.mark.parametrize('op', ['+=', '-=', '*='])
def test_an_augmented_write_into_a_slice_reaches_the_array(op):
    "y[1:] op= v is y[1:] = y[1:] op v in NumPy: its value and derivatives."
    def form(x):
        y = x * x
        if op == '+=': y[1:] += x[:3]
        elif op == '-=': y[1:] -= x[:3]
        else: y[1:] *= x[:3]
        return y
    value, d = fd.value_with_differential(form, X.copy())
    close(value, numpy_value(form, X), 1e-12)
    close(np.stack([d(e) for e in np.eye(4)], axis=1), numerical_jacobian(lambda x: numpy_value(form, x), X))


# --- what a pullback kept stays as it was (fastad's way out of PyTorch's version-counter error) ---------------------------------
def test_a_value_kept_by_an_earlier_operation_and_then_written_is_used_as_it_was():
    "h * h keeps h; h += 1 and h[0] = v afterwards make h a new array: the kept one is unchanged, the gradient right."
    w = np.array([1.0, 2.0])
    def f(x):
        h = x * w
        s = (h * h).sum()                           # PyTorch: h.add_(1) below makes backward() fail
        h += 1
        return s + h.sum()
    x = np.array([1.0, 3.0])
    value, g = fd.value_with_gradient(f, x)
    assert value == 1 + 36 + 2 + 7
    close(g, 2 * x * w * w + w, 0)                 # from the h that h * h saw, not from h + 1
    def g_(x):
        y = x * 1.0
        p = y * y                                   # keeps y
        y[0] = x[1] * 5.0
        return p.sum() + y.sum()
    close(fd.gradient(g_, x), numerical_gradient(lambda x: g_(x.copy()), x))
    close(fd.gradient(g_, x), [2.0, 6.0 + 5.0 + 1.0], 0)

def test_a_custom_pullback_that_fills_zeros_like_its_cotangent_works_in_forward_mode_and_at_second_order():
    "out = np.zeros_like(g); out[m] = g[m] inside a pullback: run on a traced g by forward mode and by a Hessian."
    def vjp(x):
        m = x > 0
        def pullback(g):
            out = np.zeros_like(g)
            out[m] = g[m] * np.cos(x[m])
            return out
        return np.where(m, np.sin(x), 0.0), pullback
    f = fd.differentiable_function(vjp)
    numpy_f = lambda x: np.where(x > 0, np.sin(x), 0.0)
    x = np.array([0.5, -1.0, 1.2])
    close(fd.differential(f, x)(np.array([1.0, 2.0, -1.0])), numerical_jacobian(numpy_f, x) @ [1.0, 2.0, -1.0])
    close(fd.jacobian(f, x), numerical_jacobian(numpy_f, x))
    loss = lambda x: (f(x) ** 2).sum()
    close(fd.hessian(loss, x), numerical_hessian(lambda x: (numpy_f(x) ** 2).sum(), x), 1e-5)

def test_zeros_like_and_its_kin_stay_plain_where_nothing_can_be_written():
    "Integer and boolean results, and arrays outside a transform, are NumPy's own."
    def f(x):
        assert type(np.zeros_like(x, dtype=int)) is np.ndarray and type(np.ones_like(x > 0)) is np.ndarray
        assert is_traced(np.zeros_like(x)) and is_traced(np.full_like(x, 2.0))
        return x.sum()
    fd.gradient(f, X.copy())

def test_what_stays_refused_names_the_line_and_the_alternative():
    def full(x): return np.full(3, x[0]).sum()
    with pytest.raises(DifferentiationError, match=r"np.full_like\(x, x, shape=shape\) or x \* np.ones\(shape\)"):
        fd.gradient(full, X.copy())
    def into_plain(x):
        y = np.zeros(4)
        np.add.at(y, [0, 1], x[:2])
        return y.sum()
    def multiply_at(x):
        y = x * 1.0
        np.multiply.at(y, [0, 0], 2.0)
        return y.sum()
    for f, words in [(into_plain, 'a plain NumPy array'), (multiply_at, 'only add.at and subtract.at')]:
        with pytest.raises(DifferentiationError, match=words) as e: fd.gradient(f, X.copy())
        assert 'test_mutation.py' in str(e.value)
    def plain_zeros(x):
        y = np.zeros(4)
        y[:2] = x[:2]                               # NumPy writes y itself
        return y.sum()
    with pytest.raises(DifferentiationError, match=r"np.zeros_like\(x\)"): fd.gradient(plain_zeros, X.copy())
    def plain_zeros_one_place(x):
        y = np.zeros(4)
        y[0] = x[0]                                 # NumPy asks float(x[0]), and reports its error as its own ValueError
        return y.sum()
    with pytest.raises(ValueError) as e: fd.gradient(plain_zeros_one_place, X.copy())
    assert isinstance(e.value.__cause__, DifferentiationError) and "np.zeros_like(x)" in str(e.value.__cause__)

def test_setting_the_shape_of_a_traced_array_names_reshape():
    def reshaped(x):
        y = x * 1.0
        y.shape = (2, 2)                            # NumPy reshapes y in place
        return y.sum()
    with pytest.raises(DifferentiationError, match=r"write y = y\.reshape\(2, 2\)"): fd.gradient(reshaped, X.copy())
    with pytest.raises(DifferentiationError, match=r"write y = y\.reshape\(2, 2\)"): fd.jit(fd.gradient(reshaped))(X.copy())
