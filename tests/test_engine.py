"""The engine's contract: NumPy routing, refusals, constants off the tape, dtypes, nesting, leaks, threads, faults."""
import gc, threading
import numpy as np, pytest
import fastad as fd
import fastad.primitives as P
from fastad.engine import Trace, Traced
from fastad.errors import DifferentiationError, NoDerivativeError
from fastad.backend import to_device, to_host, array_module
from fastad.strict import StrictArray

def close(a, b, tol=1e-9): np.testing.assert_allclose(to_host(a), to_host(b), rtol=tol, atol=tol)

# --- routing: every way NumPy code reaches the engine ----------------------------------------------
X = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7]])

@pytest.mark.parametrize('f, grad', [
    (lambda x: np.sin(x).sum(), lambda x: np.cos(x)),                       # ufunc -> __array_ufunc__
    (lambda x: np.maximum(x, 0).sum(), lambda x: (x > 0) * 1.0),
    (lambda x: (np.ones((4, 2)) @ x).sum(), lambda x: np.full_like(x, 4.0)),  # ndarray @ traced -> __array_ufunc__
    (lambda x: (np.float64(3) * x).sum(), lambda x: np.full_like(x, 3.0)),    # numpy scalar * traced
    (lambda x: (x * np.float64(3)).sum(), lambda x: np.full_like(x, 3.0)),    # traced * numpy scalar -> dunder
    (lambda x: np.sum(x * x), lambda x: 2 * x), (lambda x: np.mean(x), lambda x: np.full_like(x, 1 / 6)),
    (lambda x: np.reshape(x, -1)[1], lambda x: np.eye(6)[1].reshape(2, 3)),
    (lambda x: np.squeeze(x[:1])[2], lambda x: np.eye(6)[2].reshape(2, 3)),
    (lambda x: np.dot(x, np.ones(3)).sum(), lambda x: np.ones_like(x)),
    (lambda x: np.transpose(x)[0, 1], lambda x: np.eye(6)[3].reshape(2, 3)),
    (lambda x: np.concatenate([x, x]).sum(), lambda x: np.full_like(x, 2.0)),
    (lambda x: x.mean(), lambda x: np.full_like(x, 1 / 6)), (lambda x: x.sum(1)[0], lambda x: np.array([[1., 1, 1], [0, 0, 0]])),
    (lambda x: x.T[2, 0], lambda x: np.eye(6)[2].reshape(2, 3)), (lambda x: x.reshape(3, 2)[0, 1], lambda x: np.eye(6)[1].reshape(2, 3)),
    (lambda x: x[:1].squeeze()[0], lambda x: np.eye(6)[0].reshape(2, 3)), (lambda x: x.max(), lambda x: np.eye(6)[2].reshape(2, 3)),
    (lambda x: x.astype(np.float32).sum(), lambda x: np.ones_like(x)),
])
def test_routing(f, grad): close(fd.gradient(f, X), grad(X))

# --- what the engine refuses ------------------------------------------------------------------------
@pytest.mark.parametrize('f, name', [(np.cumsum, 'numpy.cumsum'), (np.sort, 'numpy.sort'), (np.linalg.inv, 'numpy.linalg.inv'),
                                     (lambda x: np.add.accumulate(x), 'numpy.add.accumulate'), (np.arctan, 'numpy.arctan')])
def test_no_derivative_names_the_function(f, name):
    with pytest.raises(NoDerivativeError, match=rf"{name.split('.')[-1]}.*no derivative.*derivative\(of="):
        fd.gradient(lambda x: f(x).sum(), np.eye(2) + 1)

@pytest.mark.parametrize('f, message', [
    (lambda x: np.sin(x, out=np.empty(3)).sum(), "`out=`"), (lambda x: np.sum(x, out=np.empty(())), "`out=`"),
    (lambda x: np.add(x, 1, where=np.ones(3, bool)).sum(), "`where=`"), (lambda x: np.asarray(x).sum(), "cannot become a plain NumPy array"),
    (lambda x: float(x[0]), "would drop its derivative"), (lambda x: x.__setitem__(0, 1.0), "cannot assign into a traced value"),
    (lambda x: np.clip(np.ones(3), x, 2).sum(), "numpy.clip: this argument cannot be differentiated")])
def test_refusals(f, message):
    with pytest.raises(DifferentiationError, match=message): fd.gradient(f, np.ones(3))

def test_escaped_traced_value_is_refused():
    kept = []
    fd.gradient(lambda x: (kept.append(x), x * 2)[1], 1.0)
    with pytest.raises(DifferentiationError, match="after its transform finished"): kept[0] + 1

# --- constants stay off the tape; no cotangent nobody asked for ------------------------------------------
def test_constants_never_enter_the_tape():
    data = np.ones((5, 3))
    with fd.trace_primitives() as log: fd.gradient(lambda w: np.tanh(data @ w).sum(), np.ones(3))
    assert log.count('forward') == 3 and log.count('pullback') == 3            # matmul, tanh, sum: nothing for `data`

def test_matmul_with_constant_operand_runs_one_product(monkeypatch):
    calls = []
    real = np.matmul
    def counting(a, b, *args, **kwargs): calls.append((np.shape(a), np.shape(b))); return real(a, b, *args, **kwargs)
    monkeypatch.setattr(P.np, 'matmul', counting)        # the primitives call np.matmul through their module
    data, w = np.ones((100, 20)), np.ones((20, 3))
    fd.gradient(lambda w: (data @ w).sum(), w)
    assert calls == [((100, 20), (20, 3)), ((20, 100), (100, 3))]   # forward, then only the weight's cotangent

def test_printing_switch(capsys):
    with fd.trace_primitives(show=True) as log: fd.gradient(lambda x: np.exp(x * 2.0), 1.0)
    assert capsys.readouterr().out.split() == ['forward', 'multiply', 'forward', 'exp', 'pullback', 'exp', 'pullback', 'multiply']
    assert log.count(name='exp') == 2 and log.count('pullback', 'multiply') == 1
    fd.gradient(np.sin, 1.0)
    assert capsys.readouterr().out == '' and log.count() == 4          # off outside the block

# --- types, dtypes, devices, aliasing --------------------------------------------------------------------
def test_types_follow_the_argument(any_backend):
    x32 = to_device(np.ones(3, np.float32))
    g = fd.gradient(lambda x: (x * 0.5 + np.exp(x)).sum() / 3.0, x32)
    assert g.dtype == np.float32 and array_module(g) is any_backend
    assert type(fd.gradient(lambda x: x * 2.0, np.float32(1))) is np.float32
    assert type(fd.gradient(lambda x: x * 2.0, 1.0)) is float
    assert fd.gradient(lambda x: (x * x).sum(), to_device(np.ones(3, np.float64))).dtype == np.float64

def test_gradients_own_their_memory():
    gx, gy = fd.gradient(lambda x, y: (x + y).sum(), np.ones(3), np.ones(3))
    assert gx is not gy and not np.shares_memory(gx, gy) and gx.flags.writeable and gx.base is None
    g = fd.gradient(lambda x: x.mean(), np.ones((2, 3)))          # mean's cotangent is a broadcast view inside
    assert g.flags.writeable and g.flags.owndata
    g += 1                                                          # safe to update in place

def test_device_arrays_stay_on_device(strict_backend):
    w = to_device(np.ones((3, 2))); data = to_device(np.arange(12.).reshape(4, 3))
    g = fd.gradient(lambda w: fd.logsumexp(data @ w, axis=1).mean(), w)
    assert type(g) is StrictArray and g.dtype == np.float64

# --- nesting -------------------------------------------------------------------------------------------
def test_no_perturbation_confusion():
    assert fd.gradient(lambda x: x * fd.gradient(lambda y: x + y, 1.0), 2.0) == 1.0
    assert fd.gradient(lambda x: fd.gradient(lambda y: x * y, 3.0), 2.0) == 1.0   # d/dx [d/dy xy] = 1

def test_higher_derivatives():
    close(fd.gradient(fd.gradient(np.sin))(0.7), -np.sin(0.7))
    close(fd.gradient(fd.gradient(fd.gradient(lambda x: x ** 4)))(2.0), 48.0)

def test_hessian_vector_product():
    r = np.random.default_rng(0)
    A = r.standard_normal((4, 4)); A = A + A.T
    x, v = r.standard_normal(4), r.standard_normal(4)
    f = lambda x: 0.5 * x @ (A @ x)
    hvp = fd.gradient(lambda x: (fd.gradient(f, x) * v).sum(), x)
    close(hvp, A @ v)

def test_value_with_pullback_inside_a_transform():
    def f(x):
        value, pb = fd.value_with_pullback(np.sin, x)
        return value * pb(1.0)                       # sin(x) cos(x)
    close(fd.gradient(f, 0.3), np.cos(0.6))

# --- leaks, threads, faults ----------------------------------------------------------------------------
def test_nothing_stays_alive_after_a_gradient():
    gc.collect()
    before = sum(isinstance(o, (Trace, Traced)) for o in gc.get_objects())
    fd.gradient(lambda x: (np.tanh(x) @ np.ones(3)), np.ones(3))
    gc.collect()
    assert sum(isinstance(o, (Trace, Traced)) for o in gc.get_objects()) == before

def live_traces():
    gc.collect()
    return sum(isinstance(o, Trace) for o in gc.get_objects())

def test_pullback_keeps_its_tape_only_while_referenced():
    before = live_traces()
    value, pb = fd.value_with_pullback(lambda x: np.sin(x) * 2, np.ones(1000))
    assert live_traces() == before + 1
    pb(np.ones(1000)); pb(np.ones(1000))              # calling it keeps nothing new alive
    assert live_traces() == before + 1
    del pb
    assert live_traces() == before

def test_threads_compute_independently():
    results, errors = {}, []
    def work(k):
        try:
            for i in range(50): results[k, i] = fd.gradient(lambda x: (x ** k).sum(), np.full(3, 2.0))[0]
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for t in threads: t.start()
    for t in threads: t.join(60)
    assert not errors and all(results[k, i] == k * 2.0 ** (k - 1) for k in range(1, 5) for i in range(50))

def test_exception_inside_f_leaves_the_engine_usable():
    def bad(x):
        y = np.sin(x)
        raise RuntimeError('in the middle')
    with pytest.raises(RuntimeError): fd.gradient(bad, 1.0)
    assert fd.gradient(np.sin, 0.0) == 1.0

def test_exception_in_a_hook_propagates_and_the_pullback_survives():
    calls = []
    def hook(g):
        calls.append(g)
        if len(calls) == 1: raise ValueError('hook failed once')
    value, pb = fd.value_with_pullback(lambda x: fd.with_derivative(x * 3.0, hook) ** 2, 1.0)
    with pytest.raises(ValueError, match='hook failed once'): pb(1.0)
    assert pb(1.0) == 18.0 and len(calls) == 2
