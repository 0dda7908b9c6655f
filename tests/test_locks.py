"""Locks: the arguments being differentiated are locked for the whole recording, before their first use; the arrays a
chain keeps (declared with `keeps=`, or found in a custom rule's closures) are locked until its pullback is done, and a
write into them later is refused; in-place operators on traced arrays and on views that share memory give NumPy's value
and the right gradient, or a fastad error that says what to write. The user's arrays are never written and never left
read-only."""
import numpy as np
import pytest
import fastad as fd
from fastad.errors import DifferentiationError
import gc, operator, threading
from fastad.testing import numerical_gradient
from fastad import cnn, engine, locks, primitives as P

def test_a_write_into_an_argument_before_any_chain_reads_it_is_refused():
    x = np.array([1., 2., 3.])
    alias = x                                         # the same array under another name (a model's weight held elsewhere)
    def f(t):
        s = t.sum()                                   # sum's chain reads nothing, but t's values are in s now
        alias[0] = 5.                                 # NumPy would make t[0] a constant 5 from here on
        return s + (t * t).sum()
    with pytest.raises(DifferentiationError, match="argument being differentiated"):
        fd.gradient(f, x)                             # a lock taken at t * t gave [11, 5, 7]; as run, it is [1, 5, 7]
    assert x.flags.writeable and list(x) == [1., 2., 3.]

def test_an_outer_argument_read_by_an_inner_chain_is_locked():
    X, c = np.array([1., 2., 3.]), np.full(3, 0.5)
    def outer(Xt, write):
        def inner(x):
            y = (x * Xt).sum()                        # the inner chain of x reads X, an argument of the outer gradient
            if write: X[...] = 100.                   # written through another name before the inner backward pass
            return y
        return fd.gradient(inner, c).sum()
    np.testing.assert_allclose(fd.value_with_gradient(lambda Xt: outer(Xt, False), X)[0], 6.0)
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.value_with_gradient(lambda Xt: outer(Xt, True), X)   # a lock taken at first read: inner gradient [100, 100, 100]
    assert X.flags.writeable and list(X) == [1., 2., 3.]

def test_a_gradient_penalty_through_a_dense_layer_refuses_a_write_into_its_weight():
    rng = np.random.default_rng(0)
    W, x = rng.standard_normal((3, 4)), rng.standard_normal((5, 3))
    def penalty(Wt, write):
        def inner(xs):
            out = np.tanh(xs @ Wt).sum()
            if write: W[...] = 0.
            return out
        return (fd.gradient(inner, x) ** 2).sum()
    before = W.copy()
    value, grad = fd.value_with_gradient(lambda Wt: penalty(Wt, False), W)
    assert value > 0 and grad.shape == W.shape
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.value_with_gradient(lambda Wt: penalty(Wt, True), W)
    assert W.flags.writeable and np.array_equal(W, before)


def test_a_failure_inside_scipy_is_not_hidden_by_giving_the_locks_back():
    integrate = pytest.importorskip('scipy.integrate')
    def rhs(y, t, k):
        dy = -k * y                                   # y: odeint's view of its state, kept by multiply's chain
        raise RuntimeError("the model's own error")
    def f(k): return integrate.odeint(rhs, np.array([1.0]), np.linspace(0., 1., 5), args=(k,)).sum()
    k = np.array([0.3])
    with pytest.raises(RuntimeError, match="the model's own error"):   # before: ValueError: cannot set WRITEABLE flag
        fd.gradient(f, k)
    assert k.flags.writeable                          # the argument is the user's again

def test_release_never_raises():
    r = engine.Recording(); r.locks = {}
    view = np.lib.stride_tricks.as_strided(np.ones(4), (2,), (8,))   # NumPy cannot make it writeable again, once
    locks.lock(r, view, 'multiply')                                   # read-only (as odeint's view of its state)
    assert not view.flags.writeable
    locks.release(r)                                 # gives back what it can, and never raises
    assert r.locks is None


# ---- arrays a chain keeps, written later; in-place operators on traced arrays --------------------------------------
def _writeable(*arrays): return all(a.flags.writeable for a in arrays)


# ---- arrays a chain keeps, written later ----

ROWS = [np.array([1., 2., 3.]), np.array([4., 5., 6.])]

def refilled(x, buf):
    "A loop with one scratch buffer refilled each iteration, multiplied into the result."
    y = 0.0
    for row in ROWS:
        buf[:] = row
        y = y + (x * buf).sum()
    return y

def test_refilled_buffer_is_an_error_naming_the_operation():
    buf = np.empty(3)
    with pytest.raises(DifferentiationError, match=r"passed to multiply.*buf\.copy\(\)"):
        fd.gradient(lambda x: refilled(x, buf), np.ones(3))      # before: [8, 10, 12], silently
    assert buf.flags.writeable                                    # given back after the error

def test_refilled_buffer_copied_is_right():
    buf = np.empty(3)
    def f(x):
        y = 0.0
        for row in ROWS:
            buf[:] = row
            y = y + (x * buf.copy()).sum()
        return y
    np.testing.assert_allclose(fd.gradient(f, np.ones(3)), [5., 7., 9.])
    assert buf.flags.writeable

@pytest.mark.parametrize("op", [np.add, np.subtract, lambda x, b: x - b + 1.0])
def test_a_buffer_no_chain_keeps_stays_writeable(op):
    buf = np.empty(3)
    def f(x):
        y = 0.0
        for row in ROWS:
            buf[:] = row                                          # add's chain keeps nothing: allowed
            y = y + op(x, buf).sum()
        return y
    np.testing.assert_allclose(fd.gradient(f, np.ones(3)), [2., 2., 2.])

@pytest.mark.parametrize("saving", [
    lambda x, b: x * b, lambda x, b: b * x, lambda x, b: x / b, lambda x, b: b @ x,
    lambda x, b: np.where(b > 2, x, 0.0) * b, lambda x, b: x ** b,
    lambda x, b: np.dot(b, x)])
def test_every_saving_primitive_locks_while_recording(saving):
    buf = np.array([1., 2., 3.])
    def f(x):
        y = saving(x, buf)
        buf[0] = 7.
        return np.sum(y)
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.gradient(f, np.ones(3))
    assert buf.flags.writeable and buf[0] == 1.

def test_without_derivative_is_read_only():
    def f(x):
        e = np.exp(x)
        c = fd.without_derivative(e)                              # the tape's own array: exp's chain reads it
        c[0] = 100.
        return (e * c).sum()
    with pytest.raises(DifferentiationError, match=r"without_derivative\(x\)\.copy\(\)"):
        fd.gradient(f, np.ones(2))
    def g(x):
        e = np.exp(x)
        c = fd.without_derivative(e).copy()
        c[0] = 100.
        return (e * c).sum()
    np.testing.assert_allclose(fd.gradient(g, np.ones(2)), np.e * np.array([100., np.e]))

def test_a_primitive_that_keeps_only_a_mask_leaves_the_array_writeable():
    buf = np.array([0., 2., 0.5])
    def f(x):
        y = np.maximum(x, buf)                                    # its chain keeps x >= buf, not buf
        buf[:] = 5.                                               # cannot change the gradient
        return y.sum()
    np.testing.assert_allclose(fd.gradient(f, np.ones(3)), [1., 0., 1.])
    np.testing.assert_array_equal(buf, 5.)

def test_without_derivative_of_an_input_is_read_only_while_recording_only():
    a = np.ones(3)
    seen = []
    def f(x):
        c = fd.without_derivative(x)
        seen.append(c.flags.writeable)                            # the argument, which chains read: locked
        return (x * 2).sum()
    fd.gradient(f, a)
    assert seen == [False] and a.flags.writeable
    a[0] = 5.                                                     # the user's to write again

def test_value_with_pullback_value_is_read_only_and_pullback_stays_right():
    x = np.array([0.5, 1.0])
    value, pb = fd.value_with_pullback(np.exp, x)
    with pytest.raises(ValueError, match="read-only"):
        value *= 2                                                # before: the pullback then gave 2 exp(x)
    np.testing.assert_allclose(pb(np.ones(2)), np.exp(x))
    assert not x.flags.writeable                                  # the argument: exp's chain reads it
    del pb; gc.collect()
    assert x.flags.writeable

def test_pullback_keeps_a_users_array_locked_while_it_lives():
    buf, x = np.array([1., 2., 3.]), np.ones(3)
    pb = fd.pullback(lambda x: x * buf, x)
    with pytest.raises(ValueError, match="read-only"):
        buf[:] = 0                                                # would change every later pb(...)
    np.testing.assert_allclose(pb(np.ones(3)), [1., 2., 3.])
    np.testing.assert_allclose(pb(np.ones(3)), [1., 2., 3.])
    del pb; gc.collect()
    assert buf.flags.writeable

def test_a_view_of_a_users_array_locks_its_owner():
    big = np.arange(6.).reshape(2, 3).copy()                     # big owns its memory (a view of it is locked)
    def f(x):
        y = (x * big[0]).sum()
        big[0, 0] = 9.                                            # written through the owner
        return y
    with pytest.raises(DifferentiationError, match="multiply"):
        fd.gradient(f, np.ones(3))
    assert big.flags.writeable and big[0, 0] == 0.
    np.testing.assert_allclose(fd.gradient(lambda x: (x * big[1]).sum(), np.ones(3)), [3., 4., 5.])
    assert big.flags.writeable and big[1:].flags.writeable

@pytest.mark.parametrize("error", [RuntimeError, ValueError, KeyError])
def test_flags_restored_when_f_raises(error):
    buf = np.array([1., 2.])
    def f(x):
        y = x * buf
        raise error("boom")
    with pytest.raises(error, match="boom"):
        fd.gradient(f, np.ones(2))
    assert buf.flags.writeable

def test_flags_restored_when_the_result_is_not_scalar_or_the_cotangent_is_bad():
    buf = np.array([1., 2.])
    with pytest.raises(fd.NonScalarOutputError):
        fd.gradient(lambda x: x * buf, np.ones(2))
    gc.collect()
    assert buf.flags.writeable
    pb = fd.pullback(lambda x: x * buf, np.ones(2))
    with pytest.raises(DifferentiationError):
        pb(np.ones(5))
    del pb; gc.collect()
    assert buf.flags.writeable

def test_a_users_read_only_array_stays_read_only():
    buf = np.array([1., 2.]); buf.flags.writeable = False
    np.testing.assert_allclose(fd.gradient(lambda x: (x * buf).sum(), np.ones(2)), [1., 2.])
    assert not buf.flags.writeable

def test_nested_transforms_and_threads_give_every_array_back():
    buf = np.array([1., 2., 3.])
    second = fd.gradient(lambda x: (fd.gradient(lambda u: (u * u * buf).sum(), x) * buf).sum(), np.ones(3))
    np.testing.assert_allclose(second, 2 * buf * buf)
    assert buf.flags.writeable
    errors = []
    def work():
        try:
            for _ in range(50): np.testing.assert_allclose(fd.gradient(lambda x: (x * buf).sum(), np.ones(3)), buf)
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors and buf.flags.writeable

def test_inputs_and_constants_are_never_written():
    x, c = np.array([1., 2., 3.]), np.array([2., 0.5, 4.])
    x0, c0 = x.copy(), c.copy()
    def f(x):
        y = x * c
        y += c                                                    # in-place operators make new traced values
        y *= x
        y -= 1.
        x *= 2                                                    # an input: the user's array is not written
        return (y * x).sum()
    def numpy_f(x):
        x = x.copy(); y = x * c; y += c; y *= x; y -= 1.; x *= 2
        return (y * x).sum()
    value, grad = fd.value_with_gradient(f, x)
    np.testing.assert_allclose(value, numpy_f(x))
    np.testing.assert_allclose(grad, numerical_gradient(numpy_f, x), rtol=1e-5)
    np.testing.assert_array_equal(x, x0); np.testing.assert_array_equal(c, c0)
    assert _writeable(x, c)


# ---- in-place operators on traced arrays ----

def test_an_in_place_write_through_a_view_of_a_traced_array_reaches_the_array():
    def f(v):
        y = v * 1
        z = y[:1]
        z *= 3                                                    # NumPy: y becomes [3, 2], the sum 5
        return y.sum()
    value, grad = fd.value_with_gradient(f, np.array([1., 2.]))   # before: 3.0 and [1, 1]
    assert value == 5.0
    np.testing.assert_array_equal(grad, [3., 1.])

VIEWS = {'slice': lambda y: y[:1], 'T': lambda y: y.T, 'reshape': lambda y: y.reshape(2, 1),
         'ravel': lambda y: y.ravel(), 'squeeze': lambda y: y.reshape(1, 2).squeeze(),
         'transpose': lambda y: np.transpose(y), 'step': lambda y: y[::2]}
OPS = {'+=': lambda a: operator.iadd(a, 1.), '-=': lambda a: operator.isub(a, 1.),      # as `a += 1.` runs
       '*=': lambda a: operator.imul(a, 3.), '/=': lambda a: operator.itruediv(a, 2.),
       '**=': lambda a: operator.ipow(a, 2.), '%=': lambda a: operator.imod(a, 5.)}

@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("which", ["view", "base"])
def test_in_place_on_shared_memory_matches_numpy_or_is_refused(view, op, which):
    "A write into the array or an indexed view of it: NumPy's value and gradient; into x.T or a reshape: refused."
    v0 = np.array([1., 2.])
    def f(v):
        y = v * 1
        z = VIEWS[view](y)
        OPS[op](z if which == "view" else y)
        return (y * y).sum() + (z * v[:1]).sum()
    if which == "view" and view not in ('slice', 'step'):
        with pytest.raises(DifferentiationError, match="shares memory"): fd.gradient(f, v0)
    else:
        value, grad = fd.value_with_gradient(f, v0)
        np.testing.assert_allclose(value, f(v0.copy()))
        np.testing.assert_allclose(grad, numerical_gradient(lambda v: f(v.copy()), v0), rtol=1e-5)
    np.testing.assert_array_equal(v0, [1., 2.]); assert v0.flags.writeable

@pytest.mark.parametrize("op", OPS)
def test_in_place_on_unaliased_values_matches_numpy(op):
    v0 = np.array([1.5, 2.5, 0.7])
    def f(v):
        y = v * 1.                                                # owns its memory: nothing else sees it
        y = OPS[op](y)
        return (y * v).sum()
    numpy_f = lambda v: f(v.copy())
    np.testing.assert_allclose(fd.value_with_gradient(f, v0)[0], numpy_f(v0))
    np.testing.assert_allclose(fd.gradient(f, v0), numerical_gradient(numpy_f, v0), rtol=1e-5)

def test_matmul_in_place_on_unaliased_value():
    w = np.array([[1., 2.], [3., 4.]])
    def f(x):
        y = x * 1.
        y @= w
        return y.sum()
    np.testing.assert_allclose(fd.gradient(f, np.ones((1, 2))), w.sum(1)[None, :])

def test_loss_accumulation_and_leapfrog_keep_working():
    dt, x0, v0 = 0.1, np.array([1., 0.]), np.array([0., 1.])
    def step(x, vx):
        loss = 0.0
        for _ in range(5):
            g = x                                                 # a spring: force -x
            vx -= dt * g
            x = x + dt * vx
            loss += (x ** 2).sum()
        return loss
    value, (gx, gv) = fd.value_with_gradient(step, x0, v0)      # vx -= ... on a traced vx: a new traced value
    np.testing.assert_allclose(value, step(x0.copy(), v0.copy()))
    np.testing.assert_allclose(gx, numerical_gradient(lambda x: step(x, v0.copy()), x0.copy()), rtol=1e-5)
    np.testing.assert_allclose(gv, numerical_gradient(lambda v: step(x0.copy(), v.copy()), v0.copy()), rtol=1e-5)
    np.testing.assert_array_equal(v0, [0., 1.])                   # the user's array is not written

def test_a_view_in_a_nested_transform_reaches_the_array_too():
    def f(v):
        y = v * v
        z = y[:1]
        z += v[1] * v[0]
        return (y * y).sum()
    x = np.array([1., 2.])
    np.testing.assert_allclose(fd.gradient(lambda x: fd.gradient(f, x).sum(), x),
                               numerical_gradient(lambda x: numerical_gradient(lambda v: f(v.copy()), x).sum(), x), rtol=1e-4)

def test_a_view_that_died_long_ago_does_not_confuse_a_fresh_array():
    def f(v):
        total = 0.0
        for _ in range(20):
            y = v * 2.                                            # a new array each time
            total = total + y[:1].sum()                           # a view taken, then dropped
            w = v * 3.
            w += 1.                                               # w owns fresh memory: allowed
            total = total + w.sum()
        return total
    np.testing.assert_allclose(fd.gradient(f, np.array([1., 2.])), [20 * 2 + 20 * 3, 20 * 3])


# ---- arguments, shared locks, index arrays, recomputation, aliased arguments ----

def test_an_argument_written_after_value_with_pullback_is_refused():
    x = np.array([1., 2.])
    _, pb = fd.value_with_pullback(lambda x: np.sin(x).sum(), x)
    with pytest.raises(ValueError, match="read-only"):
        x[:] = 0                                                  # before: allowed, and pb(1.0) gave [1, 1]
    np.testing.assert_allclose(pb(1.0), np.cos([1., 2.]))
    del pb; gc.collect()
    assert x.flags.writeable

def test_an_argument_written_through_another_name_is_refused():
    x0 = np.array([1., 2.])
    def f(x):
        y = np.sin(x)
        x0[:] = 0                                                 # the user's own buffer, which x wraps
        return y.sum()
    with pytest.raises(DifferentiationError, match="argument being differentiated"):
        fd.gradient(f, x0)                                        # before: [1, 1]
    assert x0.flags.writeable and list(x0) == [1., 2.]

def test_two_pullbacks_over_one_constant_share_its_lock():
    c = np.array([3., 4.])
    _, pb1 = fd.value_with_pullback(lambda x: (x * c).sum(), np.ones(2))
    _, pb2 = fd.value_with_pullback(lambda x: (x * c).sum(), np.ones(2))
    del pb1; gc.collect()
    assert not c.flags.writeable                                  # before: writeable, and pb2 gave [0, 0] after c[:] = 0
    with pytest.raises(ValueError, match="read-only"):
        c[:] = 0
    np.testing.assert_allclose(pb2(1.0), [3., 4.])
    del pb2; gc.collect()
    assert c.flags.writeable

def test_a_view_and_its_owner_held_by_two_pullbacks():
    big = np.arange(6.)
    _, pb_view = fd.value_with_pullback(lambda x: (x * big[:3]).sum(), np.ones(3))
    _, pb_owner = fd.value_with_pullback(lambda x: (x * big).sum(), np.ones(6))
    del pb_view; gc.collect()
    assert not big.flags.writeable                                # before: released with the view's pullback
    np.testing.assert_allclose(pb_owner(1.0), np.arange(6.))
    del pb_owner; gc.collect()
    assert big.flags.writeable

def test_a_users_read_only_choice_outlives_two_pullbacks():
    c = np.array([3., 4.]); c.flags.writeable = False
    pbs = [fd.pullback(lambda x: (x * c).sum(), np.ones(2)) for _ in range(2)]
    del pbs; gc.collect()
    assert not c.flags.writeable

def test_locks_counted_across_threads():
    c = np.array([3., 4.])
    errors = []
    def work():
        try:
            for _ in range(200):
                _, pb = fd.value_with_pullback(lambda x: (x * c).sum(), np.ones(2))
                assert not c.flags.writeable
                np.testing.assert_allclose(pb(1.0), [3., 4.])
                del pb
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    gc.collect()
    assert not errors and c.flags.writeable

def test_a_write_in_another_threads_transform_names_the_live_pullback():
    c = np.array([3., 4.])
    _, pb = fd.value_with_pullback(lambda x: (x * c).sum(), np.ones(2))
    def g(x):
        c[0] = 1.                                                 # c is read by pb, still alive
        return (x * 2).sum()
    with pytest.raises(DifferentiationError, match="pullback that is still alive"):
        fd.gradient(g, np.ones(2))
    np.testing.assert_allclose(pb(1.0), [3., 4.])

INDEXED = {'getitem': lambda x, i: x[i], 'take': lambda x, i: np.take(x, i),
           'take_along_axis': lambda x, i: np.take_along_axis(x, i, 0)}

@pytest.mark.parametrize("how", INDEXED)
def test_an_index_array_written_after_use_is_refused(how):
    idx = np.array([0, 0, 1])
    def f(x):
        y = INDEXED[how](x, idx)                                  # the pullback scatters by idx
        idx[:] = 2                                                # refilled for the next batch
        return (y * np.array([1., 2., 3.])).sum()
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.gradient(f, np.ones(3))                                # before (getitem): [0, 0, 6], silently
    assert idx.flags.writeable and list(idx) == [0, 0, 1]
    np.testing.assert_allclose(fd.gradient(lambda x: (INDEXED[how](x, idx) * np.array([1., 2., 3.])).sum(),
                                           np.ones(3)), [3., 3., 0.])

def test_a_mask_written_after_use_is_refused():
    mask = np.array([True, False, True])
    def f(x):
        y = x[mask]; mask[:] = True; return y.sum()
    with pytest.raises(DifferentiationError, match="getitem"):
        fd.gradient(f, np.ones(3))                                # before: NumPy's ValueError in the backward pass
    assert mask.flags.writeable

def test_a_constant_of_a_recomputed_function_is_locked():
    mul = fd.make_recomputed_in_gradient(lambda x, c: x * c)
    c = np.array([1., 2.])
    def f(x):
        y = mul(x, c)
        c[:] = c[::-1].copy()                                     # same sum: the replay's fingerprint cannot see it
        return (y * np.array([1., 10.])).sum()
    with pytest.raises(DifferentiationError, match="passed to <lambda>"):
        fd.gradient(f, np.ones(2))                                # before: [2, 10], silently
    assert c.flags.writeable
    layer = fd.Dense(weight=np.array([[1., 2.], [3., 4.]]), bias=np.zeros(2))
    discarding = layer.discarding_activations()
    def g(x):
        y = discarding(x)                                         # a constant layer: its weight is read again
        layer.weight[0, 0] = 5.
        return y.sum()
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.gradient(g, np.ones((1, 2)))
    assert layer.weight.flags.writeable

def test_a_changed_input_of_a_recomputation_is_named():
    c = np.array([1., 2.])
    body = fd.make_recomputed_in_gradient(lambda x: x * c)       # c through a closure: not an argument
    def f(x):
        y = body(x); c[:] = 5.; return y.sum()
    with pytest.raises(DifferentiationError, match="an input changed"):
        fd.gradient(f, np.ones(2))                                # before: blamed random generators alone

def test_in_place_on_an_argument_passed_twice_is_refused():
    def f(x, y):
        x += 1.0
        return (x * y).sum()
    a = np.array([1., 2.])
    with pytest.raises(DifferentiationError, match="another argument passed the same array"):
        fd.value_with_gradient(f, a, a)                           # before: 8.0; NumPy: 13.0
    b = np.array([1., 2.])
    value, (gx, gy) = fd.value_with_gradient(f, b, b.copy())      # not shared: as NumPy
    assert value == 8.0 and list(gx) == [1., 2.] and list(gy) == [2., 3.]
    assert a.flags.writeable and list(a) == [1., 2.]

def test_in_place_on_an_argument_then_read_through_a_constant_is_refused():
    a0 = np.array([1., 2.])
    def h(x):
        x += 1.0                                                  # NumPy writes a0 itself
        return (x * a0).sum()
    with pytest.raises(DifferentiationError, match="shares memory with an argument"):
        fd.value_with_gradient(h, a0)                             # before: 8.0; NumPy: 13.0
    assert a0.flags.writeable
    np.testing.assert_allclose(fd.value_with_gradient(h, a0.copy())[0], 8.0)   # another array: allowed
    def view_of_it(x):
        x += 1.0
        return (x * a0[::-1]).sum()
    with pytest.raises(DifferentiationError, match="shares memory with an argument"):
        fd.gradient(view_of_it, a0)


# ---- what a primitive's chains keep (found in their closures), and the locks the engine takes from it ------------
rng = np.random.default_rng(0)
A, B = rng.uniform(0.5, 2, (3, 4)), rng.uniform(0.5, 2, (3, 4))
X, F, BIAS = rng.standard_normal((2, 6, 6, 3)), rng.standard_normal((3, 3, 3, 4)), rng.standard_normal(4)
LOGITS, LABELS = rng.standard_normal((5, 3)), np.array([0, 2, 1, 1, 0])
G = rng.standard_normal((2, 4, 4, 4))
GEOMETRY = ((2, 6, 6, 3), ((0, 0), (0, 0)), (2, 6, 6, 3), (2, 2), (2, 2), (3, 3))

def test_only_what_a_recorded_chain_reads_is_locked():
    c, m = np.array([1., 2.]), np.array([True, False])
    seen = []
    def f(w):
        y = np.where(m, w, c) + c / w                 # w's chains read the mask, and w itself: c is read by no recorded chain
        seen.append((m.flags.writeable, c.flags.writeable))
        return y.sum()
    np.testing.assert_allclose(fd.gradient(f, np.array([1., 2.])), [1. - 1., -2. / 4])
    assert seen == [(False, True)] and m.flags.writeable
    x, filt, seen = X.copy(), F.copy(), []
    def g(x):
        y = cnn.conv2d(x, filt, BIAS)                 # the filter a constant: x's chain reads it
        seen.append(filt.flags.writeable)
        return y.sum()
    fd.gradient(g, x)
    assert seen == [False] and filt.flags.writeable

def test_labels_written_after_the_loss_leave_its_gradient_right():
    labels = LABELS.copy()
    def f(logits):
        loss = cnn.softmax_cross_entropy(logits, labels=labels)
        labels[0] = 2                                 # the next batch's: the chain made its one-hot rows already
        return loss
    np.testing.assert_allclose(fd.gradient(f, LOGITS), fd.gradient(lambda l: cnn.softmax_cross_entropy(l, LABELS), LOGITS))
    assert labels.flags.writeable and labels[0] == 2

def test_an_index_passed_by_keyword_is_locked():
    idx = np.array([2, 0])
    def f(x):
        y = np.take(x, indices=idx)                   # take's pullback scatters by idx
        idx[0] = 1
        return (y * np.array([1., 10.])).sum()
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.gradient(f, np.ones(3))
    assert idx.flags.writeable and list(idx) == [2, 0]

def test_the_batch_of_a_convolution_is_locked_its_bias_is_not():
    x, seen = X.copy(), []
    def f(filter, bias):
        y = cnn.conv2d(x, filter, bias)
        seen.append(x.flags.writeable)                # the filter's cotangent is rebuilt from x: locked
        return y.sum()
    fd.gradient(f, F, BIAS)
    assert seen == [False] and x.flags.writeable

def test_a_custom_rule_is_still_looked_into():
    buf = np.array([1., 2., 3.])
    def scale_vwc(x, s): return x * s, (lambda g: g * s, None)
    scale = P.Primitive('scale', scale_vwc)           # the engine looks into its chains
    def f(x):
        y = scale(x, buf)
        buf[0] = 7.
        return y.sum()
    with pytest.raises(DifferentiationError, match="passed to scale"):
        fd.gradient(f, np.ones(3))
    assert buf.flags.writeable

def test_steps_leave_no_lock_behind():
    model = [fd.Conv2D(filter=F.astype(np.float32), bias=BIAS.astype(np.float32), activation=None),
             fd.MaxPool2D(), fd.Flatten(), fd.Dense(weight=rng.standard_normal((16, 3)).astype(np.float32),
                                                   bias=np.zeros(3, np.float32), activation=None)]
    x = X[:, :, :, :].astype(np.float32)
    loss = lambda m: fd.softmax_cross_entropy(fd.sequenced(x, through=m), LABELS[:2])
    for _ in range(3): fd.value_with_gradient(loss, model)
    gc.collect()
    assert locks._locked == {}
    assert all(a.flags.writeable for a in (x, model[0].filter, model[0].bias, model[3].weight, model[3].bias))
    value, pb = fd.value_with_pullback(loss, model)
    assert not x.flags.writeable and not model[3].weight.flags.writeable
    del pb; gc.collect()
    assert locks._locked == {} and x.flags.writeable


# ---- a chain that reads nothing is made once -----------------------------------------------------------------------
@pytest.mark.parametrize('vwc, args', [(P.add_vwc, (0.3, 0.2)), (P.subtract_vwc, (0.3, 0.2)), (P.negative_vwc, (0.3,)),
                                       (P.positive_vwc, (0.3,)), (P.add_vwc, (A, B))])
def test_a_chain_that_reads_nothing_is_made_once_not_per_operation(vwc, args):
    "`+` on a tape makes no new function: its chains are shared (a scalar chain spends much of its time making them)."
    (_, first), (_, second) = vwc(*args), vwc(*args)
    chains = lambda c: c if isinstance(c, tuple) else (c,)
    assert all(a is b for a, b in zip(chains(first), chains(second)))
    assert all(c.__closure__ is None for c in chains(first))      # it keeps nothing, so no lock or saved bytes either
    g = np.full(np.shape(vwc(*args)[0]), 2.0)
    expected = {P.subtract_vwc: (2.0, -2.0), P.negative_vwc: (-2.0,)}.get(vwc, (2.0, 2.0))
    assert [float(np.mean(c(g))) for c in chains(first)] == list(expected[:len(chains(first))])

def test_remainders_x_chain_is_shared_its_y_chain_keeps_the_quotient():
    (_, (dx1, dy1)), (_, (dx2, dy2)) = P.remainder_vwc(7.5, 2.0), P.remainder_vwc(7.5, 2.0)
    assert dx1 is dx2 and dx1.__closure__ is None and dx1(3.0) == 3.0
    assert dy1 is not dy2 and dy1(1.0) == -3.0                     # -g * floor(7.5 / 2): it reads x and y


# ---- device arrays (the strict backend's, CuPy's): no read-only flag, so a chain keeps a copy ----------------------
def test_a_device_array_written_before_the_pullback_runs_leaves_the_gradient_right():
    with fd.use_backend('strict') as xp:
        buf = xp.asarray([1., 2.])
        value, pb = fd.value_with_pullback(lambda x: (x * buf).sum(), xp.asarray([3., 4.]))
        buf[0] = 5.                                   # was read by the pullback: gradient [5, 2]
        np.testing.assert_array_equal(fd.backend.to_host(pb(1.0)), [1., 2.])
        assert float(value) == 11. and fd.backend.to_host(buf).tolist() == [5., 2.]   # the user's array, written

def test_a_device_array_written_inside_the_function_leaves_the_gradient_right():
    with fd.use_backend('strict') as xp:
        X, idx = xp.asarray(np.arange(6.).reshape(2, 3)), xp.asarray([2, 0])
        def f(w):
            y = (X @ w).sum() + w[idx].sum()          # w's chains keep X and idx
            X[...] = 0.; idx[...] = 1                 # refilled for the next batch
            return y
        np.testing.assert_array_equal(fd.backend.to_host(fd.gradient(f, xp.ones(3))), [4., 5., 8.])

def test_a_device_array_kept_where_no_copy_can_be_put_is_given_a_copy_all_the_same():
    class Times:                                      # a chain that is a callable object: its field is out of reach
        def __init__(self, s): self.s = s
        def __call__(self, g): return g * self.s
    def scale_vwc(x, s): return x * s, (Times(s), None)
    scale = P.Primitive('scale', scale_vwc)
    with fd.use_backend('strict') as xp:
        buf = xp.asarray([1., 2.])
        value, pb = fd.value_with_pullback(lambda x: scale(x, buf).sum(), xp.ones(2))
        buf[...] = 9.
        np.testing.assert_array_equal(fd.backend.to_host(pb(1.0)), [1., 2.])

def test_a_numpy_array_kept_by_a_chain_is_still_locked_not_copied():
    buf = np.array([1., 2.])
    value, pb = fd.value_with_pullback(lambda x: (x * buf).sum(), np.array([3., 4.]))
    with pytest.raises(ValueError, match="read-only"): buf[0] = 5.
    np.testing.assert_array_equal(pb(1.0), [1., 2.])
    del pb; gc.collect()
    assert buf.flags.writeable

# ---- device arguments: no flag to lock, so a write while the gradient is computed refuses it -----------------------
def _write_between(xp, transform):
    "The gradient `transform` gives at [1, 2] of (x * x).sum(), the argument written after recording, before the pullback."
    x = xp.asarray([1., 2.])
    run = transform(x)
    x[0] = 5.
    return run()

@pytest.mark.parametrize("transform", [
    lambda x: (lambda pb: lambda: pb(1.0))(fd.value_with_pullback(lambda x: (x * x).sum(), x)[1]),
    lambda x: (lambda pb: lambda: pb(1.0))(fd.pullback(lambda x: (x * x).sum(), x)),
    lambda x: (lambda pb: lambda: pb(1.0))(fd.pullback(lambda x, k: (x * x).sum() * k, x, 1.0, argnums=0)),
    lambda x: (lambda bp: lambda: bp(np.ones_like(x))[0])(fd.applied_for_backpropagation(     # d_weight reads x
        fd.Dense(weight=fd.backend.array_module(x).eye(2), bias=np.zeros_like(x)), x)[1]),
], ids=['value_with_pullback', 'pullback', 'pullback_argnums', 'applied_for_backpropagation'])
def test_a_device_argument_written_before_the_pullback_runs_is_refused(transform):
    with fd.use_backend('strict') as xp:
        with pytest.raises(fd.DifferentiationError, match=r"its argument.*shape \(2,\), was written.*Pass a copy"):
            _write_between(xp, transform)              # was [10, 4]: the gradient from the new values

def test_a_model_parameter_written_before_backprop_is_named():
    with fd.use_backend('strict') as xp:
        model = fd.Dense(weight=xp.asarray(np.eye(2)), bias=xp.zeros(2))
        out, backprop = fd.applied_for_backpropagation(model, xp.asarray([[1., 2.]]))
        d_model, d_x = backprop(xp.ones((1, 2)))       # unwritten: runs, and again
        model.weight[0, 0] = 3.                        # an optimizer step in place, before the backprop
        with pytest.raises(fd.DifferentiationError, match=r"leaf \d \(of 3\), a device array of shape \(2, 2\)"):
            backprop(xp.ones((1, 2)))

def test_f_writing_its_device_argument_through_another_name_is_refused():
    with fd.use_backend('strict') as xp:
        x = xp.asarray([1., 2.]); a = x
        def after_use(x): y = x * x; a[0] = 5.; return y.sum()         # was [10, 4] (NumPy: [2, 4], or refused)
        with pytest.raises(fd.DifferentiationError, match="gradient of after_use: its argument"):
            fd.value_with_gradient(after_use, x)
        x[0] = 1.
        with pytest.raises(fd.DifferentiationError, match="gradient of after_use"): fd.gradient(after_use, x)

def test_device_arguments_unwritten_or_passed_twice_are_right():
    with fd.use_backend('strict') as xp:
        x = xp.asarray([1., np.nan])
        v, pb = fd.value_with_pullback(lambda x: (x * 3.).sum(), x)     # a NaN equals itself: not a write
        np.testing.assert_array_equal(fd.to_host(pb(1.0)), [3., 3.])
        a = xp.asarray([1., 2.])
        ga, gb = fd.gradient(lambda u, w: (u * w).sum(), a, a)          # f(a, a): each gets the other
        np.testing.assert_array_equal(fd.to_host(ga), [1., 2.]); np.testing.assert_array_equal(fd.to_host(gb), [1., 2.])
        big = xp.asarray(np.linspace(0., 1., (fd.locks.COPIED_BELOW // 8) + 5))   # noted by its bits' sums
        v, pb = fd.value_with_pullback(lambda x: (x * x).sum(), big)
        assert fd.to_host(pb(1.0))[-1] == 2.
        big[3], big[4] = float(big[4]), float(big[3])   # a swap keeps the total: the rows' and columns' sums see it
        with pytest.raises(fd.DifferentiationError, match="was written"): pb(1.0)

def test_numpy_arguments_are_still_locked_and_not_noted():
    x = np.array([1., 2.])
    v, pb = fd.value_with_pullback(lambda x: (x * x).sum(), x)
    with pytest.raises(ValueError, match="read-only"): x[0] = 5.
    np.testing.assert_array_equal(pb(1.0), [2., 4.])
    r = fd.engine.Recording(); r.locks = {}
    assert fd.locks.lock_arguments(r, [x, 1.0]) is None   # nothing for argument_prints to do
    fd.locks.release(r)
    del pb; gc.collect()
    assert x.flags.writeable

def _reads_in_check(monkeypatch):
    "Count the strict backend's reads back to the host (bool(), float(), .get(), .item(), .tolist()) made by check_unwritten."
    from fastad import strict, transforms
    reads, inside = [], [False]
    for method in ('_scalar', 'get', 'item', 'tolist'):
        def counted(self, *args, _read=getattr(strict.StrictArray, method), _name=method):
            if inside[0]: reads.append(_name)
            return _read(self, *args)
        monkeypatch.setattr(strict.StrictArray, method, counted)
    def check(*args, _check=transforms.check_unwritten):
        inside[0] = True
        try: return _check(*args)
        finally: inside[0] = False
    monkeypatch.setattr(transforms, 'check_unwritten', check)
    return reads

def test_checking_a_models_device_arguments_reads_back_once(monkeypatch):
    reads = _reads_in_check(monkeypatch)
    with fd.use_backend('strict') as xp:
        rng = np.random.default_rng(0)
        big = xp.asarray(rng.standard_normal((fd.locks.COPIED_BELOW // 8 + 7, 1)))    # noted by its bits' sums
        model = fd.Sequential([fd.Dense(weight=xp.asarray(rng.standard_normal((3, 4))), bias=xp.zeros(4)),
                               fd.Dense(weight=xp.asarray(rng.standard_normal((4, 2)), dtype=np.float32), bias=xp.zeros(2))])
        out, backprop = fd.applied_for_backpropagation(model, xp.ones((5, 3)))
        backprop(xp.ones((5, 2)))
        assert len(reads) == 1                         # 5 leaves (model and x) of two dtypes: was 5 reads, one each
        reads.clear()
        g = fd.gradient(lambda m, b, x: (m(x) * b[:5].sum()).sum(), model, big, xp.ones((5, 3)))
        assert len(reads) == 1                         # with a large one: was 5, plus 2 for the large one's sums
        reads.clear()
        model.layers[1].bias[1] = np.nan               # a NaN that stays one: unchanged, read again only for its group
        out, backprop = fd.applied_for_backpropagation(model, xp.ones((5, 3)))
        backprop(xp.ones((5, 2)))
        model.layers[1].weight[0, 0] = 7.              # a write: refused, naming the leaf
        with pytest.raises(DifferentiationError, match=r"leaf 2 \(of 5\), a device array of shape \(4, 2\)"):
            backprop(xp.ones((5, 2)))
