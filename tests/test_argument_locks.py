"""The arguments being differentiated are locked for the whole recording, before their first use.

A review of the cheaper locking found two writes that a lock taken only when a chain first reads an argument let
through, each giving a wrong gradient with no error; both are refused again, and these tests keep them so."""
import numpy as np
import pytest
import fastad as fd
from fastad.errors import DifferentiationError

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
    from fastad import engine
    r = engine.Recording(); r.locks = {}
    view = np.lib.stride_tricks.as_strided(np.ones(4), (2,), (8,))   # NumPy cannot make it writeable again, once
    engine.lock(r, view, 'multiply')                                  # read-only (as odeint's view of its state)
    assert not view.flags.writeable
    engine.release(r)                                 # gives back what it can, and never raises
    assert r.locks is None
