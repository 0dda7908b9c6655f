"""SciPy on traced values (fastad.scipy_rules, nbs/03g_scipy.ipynb), against float64 central differences.

Every covered function is checked at first order; the special functions, softmax and logsumexp at second order too,
on NumPy and under the strict backend. SciPy's own routines (linalg, signal) need host arrays, as SciPy does, so
those run on NumPy. The central differences call SciPy itself on host arrays: the reference is SciPy's value.
And SciPy's edges: polygamma's orders, densities at their ends, xlogy where x is 0, logsumexp over empty or -inf slices.
"""
import subprocess, sys, textwrap, warnings
import numpy as np, pytest

pytest.importorskip('scipy', reason="SciPy is optional (pip install 'fastad[scipy]'); these tests check fastad's rules for it")
from scipy import special, stats, linalg, signal
import fastad as fd
from fastad import scipy_rules as S
from fastad.backend import to_device, to_host, use_backend
from fastad.strict import StrictArray
from fastad.engine import unbox
import scipy.special as sp, scipy.stats as st
from fastad.testing import numerical_gradient

BACKENDS = ['numpy', 'strict']

def check(f, *xs, backend='numpy', eps=1e-6, tol=1e-6, seed=0):
    "fd.pullback(f) at xs (on `backend`) against central differences of f on host float64 arrays."
    rng = np.random.default_rng(seed)
    hosts = [np.asarray(x, np.float64) for x in xs]
    with use_backend(backend):
        devs = [to_device(x) for x in hosts]
        value, pb = fd.value_with_pullback(f, *devs)
        v = rng.standard_normal(np.shape(to_host(value)))
        grads = pb(to_device(v))
    grads = grads if len(xs) > 1 else (grads,)
    for i, (x, g) in enumerate(zip(hosts, grads)):
        assert np.shape(g) == x.shape, (i, np.shape(g), x.shape)
        if backend == 'strict': assert type(g) is StrictArray, (i, type(g))
        d = rng.standard_normal(x.shape)
        def directional(t): return float(np.sum(v * f(*hosts[:i], x + t * d, *hosts[i + 1:])))
        numeric = (directional(eps) - directional(-eps)) / (2 * eps)
        analytic = float(np.sum(to_host(g) * d))
        assert abs(analytic - numeric) <= tol * max(1.0, abs(numeric)), (i, analytic, numeric)

def check_second(f, *xs, backend='numpy', tol=1e-5):
    "The gradient of <w, f> in each argument, itself checked by `check`: second derivatives."
    w = np.random.default_rng(1).standard_normal(np.shape(f(*[np.asarray(x, np.float64) for x in xs])))
    for i in range(len(xs)):
        def grad_i(y, i=i):
            on = (lambda a: to_device(a)) if type(unbox(y)) is StrictArray else (lambda a: a)   # numerics run on the host
            others, wd = [on(np.asarray(x, np.float64)) for x in xs], on(w)
            return fd.gradient(lambda z: np.sum(wd * f(*others[:i], z, *others[i + 1:])), y)
        with warnings.catch_warnings():              # xlogy is linear in x: its gradient there is constant
            warnings.simplefilter('ignore', fd.ZeroDerivativeWarning)
            check(grad_i, xs[i], backend=backend, tol=tol)

rng = np.random.default_rng(0)
ANY = rng.standard_normal(6)
POSITIVE = rng.uniform(0.5, 3.0, 6)
UNIT = rng.uniform(0.1, 0.9, 6)

SPECIAL_UNARY = {
    'gammaln': (special.gammaln, POSITIVE), 'digamma': (special.digamma, POSITIVE), 'psi': (special.psi, POSITIVE),
    'polygamma 1': (lambda x: special.polygamma(1, x), POSITIVE), 'polygamma 3': (lambda x: special.polygamma(3, x), POSITIVE),
    'expit': (special.expit, ANY), 'logit': (special.logit, UNIT), 'erf': (special.erf, ANY), 'erfc': (special.erfc, ANY),
    'erfinv': (special.erfinv, UNIT * 1.6 - 0.8), 'ndtr': (special.ndtr, ANY), 'log_ndtr': (special.log_ndtr, ANY * 3),
    'ndtri': (special.ndtri, UNIT), 'i0e': (special.i0e, ANY * 2), 'i1e': (special.i1e, ANY * 2),
    'zeta in q': (lambda q: special.zeta(3, q), POSITIVE),
}
SPECIAL_BINARY = {
    'xlogy': (special.xlogy, ANY, POSITIVE), 'xlog1py': (special.xlog1py, ANY, UNIT),
    'betaln': (special.betaln, POSITIVE, POSITIVE[::-1]),
    'xlogy broadcast': (special.xlogy, ANY[:1], POSITIVE.reshape(2, 3)),
}

@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', SPECIAL_UNARY)
def test_special_ufuncs_first_and_second_order(name, backend):
    f, x = SPECIAL_UNARY[name]
    check(f, x, backend=backend)
    check_second(f, x, backend=backend)

@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', SPECIAL_BINARY)
def test_special_binary_first_and_second_order(name, backend):
    f, x, y = SPECIAL_BINARY[name]
    check(f, x, y, backend=backend)
    check_second(f, x, y, backend=backend)

def test_gammaln_to_the_fourth_order():
    "Each slope is another rule's function (digamma, polygamma, zeta), so the derivatives go on."
    x = np.array([0.7, 1.5, 3.0])
    d = special.gammaln
    for n in range(4):
        d = (lambda f: lambda y: fd.gradient(lambda z: np.sum(f(z)), y))(d)
    np.testing.assert_allclose(d(x), special.polygamma(3, x), rtol=1e-10)

def test_log_ndtr_slope_is_finite_far_in_the_tail():
    x = np.array([-40.0, -10.0, 0.0, 10.0])
    g = fd.gradient(lambda x: np.sum(special.log_ndtr(x)), x)
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g[0], 40.025, rtol=1e-3)        # φ/Φ ≈ -x - 1/x far to the left

REDUCTIONS = {
    'logsumexp': lambda a: special.logsumexp(a),
    'logsumexp axis': lambda a: special.logsumexp(a, axis=1),
    'logsumexp axis keepdims': lambda a: special.logsumexp(a, axis=0, keepdims=True),
    'logsumexp tuple axis': lambda a: special.logsumexp(a, axis=(0, 1)),
    'softmax': lambda a: special.softmax(a), 'softmax axis': lambda a: special.softmax(a, axis=-1),
    'log_softmax': lambda a: special.log_softmax(a), 'log_softmax axis': lambda a: special.log_softmax(a, axis=0),
}

@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', REDUCTIONS)
def test_logsumexp_softmax_log_softmax(name, backend):
    a = rng.standard_normal((3, 4))
    check(REDUCTIONS[name], a, backend=backend)
    check_second(REDUCTIONS[name], a, backend=backend)

@pytest.mark.parametrize('backend', BACKENDS)
def test_logsumexp_weights_and_sign(backend):
    a, b = rng.standard_normal((3, 4)), rng.uniform(0.5, 2.0, (1, 4))
    check(lambda a, b: special.logsumexp(a, axis=1, b=b), a, b, backend=backend)
    check_second(lambda a, b: special.logsumexp(a, axis=1, b=b), a, b, backend=backend)
    signed = b * np.array([[1.0, -1.0, 1.0, 1.0]])
    check(lambda a, b: special.logsumexp(a, b=b, axis=0, return_sign=True)[0], a, signed, backend=backend)

def test_logsumexp_return_sign_and_value_match_scipy():
    a, b = rng.standard_normal((3, 4)), np.array([1.0, -3.0, 1.0, 1.0])
    value, sign = fd.value_with_pullback(lambda a: special.logsumexp(a, b=b, axis=1, return_sign=True), a)[0]
    want, want_sign = special.logsumexp(a, b=b, axis=1, return_sign=True)
    np.testing.assert_allclose(value, want); np.testing.assert_array_equal(sign, want_sign)
    for f in (lambda a: special.logsumexp(a), lambda a: special.softmax(a, axis=1), lambda a: special.log_softmax(a)):
        np.testing.assert_allclose(fd.value_with_pullback(f, a)[0], f(a))

# --- scipy.stats ---------------------------------------------------------------------------------------------------
X = rng.standard_normal(5)
STATS = {   # name: (f, arguments): every argument is differentiated
    'norm.logpdf': (lambda x, m, s: stats.norm.logpdf(x, m, s), (X, 0.3, 1.7)),
    'norm.pdf': (lambda x, m, s: stats.norm.pdf(x, m, s), (X, 0.3, 1.7)),
    'norm.cdf': (lambda x, m, s: stats.norm.cdf(x, m, s), (X, 0.3, 1.7)),
    'norm.logcdf': (lambda x, m, s: stats.norm.logcdf(x, m, s), (X, 0.3, 1.7)),
    'norm.sf': (lambda x, m, s: stats.norm.sf(x, m, s), (X, 0.3, 1.7)),
    'norm.logpdf x only': (lambda x: stats.norm.logpdf(x), (X,)),
    'norm.logpdf plain scale keyword': (lambda x, m: stats.norm.logpdf(x, m, scale=2.0), (X, 0.3)),
    't.logpdf': (lambda x, df, m, s: stats.t.logpdf(x, df, m, s), (X, 3.5, 0.2, 1.3)),
    'gamma.logpdf': (lambda x, a, m, s: stats.gamma.logpdf(x, a, m, s), (POSITIVE[:5], 2.5, -0.4, 1.5)),
    'beta.logpdf': (lambda x, a, b, m, s: stats.beta.logpdf(x, a, b, m, s), (UNIT[:5], 2.5, 1.5, -0.05, 1.2)),
    'poisson.logpmf in the rate': (lambda mu: stats.poisson.logpmf(3, mu), (np.array([0.5, 1.5, 2.5, 6.0]),)),
    'poisson.logpmf, loc': (lambda mu: stats.poisson.logpmf(5, mu, 2), (np.array([0.5, 1.5, 2.5, 6.0]),)),
    'dirichlet.logpdf': (lambda x, a: stats.dirichlet.logpdf(x / np.sum(x), a),     # on the simplex, as SciPy insists
                         (np.array([0.2, 0.3, 0.5]), np.array([1.5, 2.0, 3.0]))),
    'dirichlet.logpdf K-1 components, batch': (lambda x, a: stats.dirichlet.logpdf(x, a),
                                                (np.array([[0.2, 0.1], [0.3, 0.6]]), np.array([1.5, 2.0, 3.0]))),
}

@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', STATS)
def test_stats(name, backend):
    f, args = STATS[name]
    check(f, *args, backend=backend)

@pytest.mark.parametrize('name', ['norm.logpdf', 't.logpdf', 'gamma.logpdf', 'dirichlet.logpdf'])
def test_stats_second_order(name):
    f, args = STATS[name]
    check_second(f, *args)

def spd(n, seed=0):
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a @ a.T + n * np.eye(n)

MVN = {
    'x, mean, cov': (lambda x, m, c: stats.multivariate_normal.logpdf(x, m, c), (X[:3], X[2:], spd(3))),
    'keywords': (lambda x, m, c: stats.multivariate_normal.logpdf(x, mean=m, cov=c), (X[:3], X[2:], spd(3))),
    'n points': (lambda x, c: stats.multivariate_normal.logpdf(x, cov=c), (rng.standard_normal((4, 3)), spd(3, 1))),
    'scalar variance': (lambda x, v: stats.multivariate_normal.logpdf(x, 0.5 * x, v), (X[:3], 1.7)),
    'variances': (lambda x, v: stats.multivariate_normal.logpdf(x, 0.5 * x, v), (X[:3], POSITIVE[:3])),
    'd = 1, n points': (lambda x, m: stats.multivariate_normal.logpdf(x, m, 2.0), (X, np.array([0.3]))),
}

@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name', MVN)
def test_multivariate_normal_logpdf(name, backend):
    f, args = MVN[name]
    check(f, *args, backend=backend)
    np.testing.assert_allclose(fd.value_with_pullback(f, *args)[0], f(*args))

def test_multivariate_normal_second_order():
    check_second(lambda x, m, c: stats.multivariate_normal.logpdf(x, m, c), X[:3], X[2:], spd(3))

@pytest.mark.parametrize('name', STATS)
def test_stats_values_match_scipy(name):
    f, args = STATS[name]
    np.testing.assert_allclose(fd.value_with_pullback(f, *args)[0], f(*args), rtol=1e-12, atol=1e-300)

def test_outside_the_support_is_minus_inf_with_no_nan_slope():
    x = np.array([-1.0, 0.5, 2.0])
    value, g = fd.value_with_gradient(lambda a: np.sum(np.exp(stats.gamma.logpdf(x, a))), 2.0)
    np.testing.assert_allclose(value, np.sum(stats.gamma.pdf(x, 2.0)))
    assert np.isfinite(g)

def test_a_distribution_without_a_rule_is_named():
    with pytest.raises(fd.NoDerivativeError, match=r"scipy\.stats\.cauchy\.logpdf has no derivative in fastad"):
        fd.gradient(lambda x: np.sum(stats.cauchy.logpdf(x)), X)

def test_traced_loc_by_keyword_is_differentiated():
    "SciPy takes loc= and scale= through **kwds: fastad differentiates them too (tests/test_scipy_keywords.py has more)."
    np.testing.assert_allclose(fd.gradient(lambda m: np.sum(stats.norm.logpdf(X, loc=m)), 0.3), np.sum(X - 0.3))

# --- scipy.linalg and scipy.signal: SciPy's own routines, on host arrays ---------------------------------------------
def tri(n, lower, seed=0):
    a = np.random.default_rng(seed).standard_normal((n, n)) * 0.3 + 2 * np.eye(n)
    return np.tril(a) if lower else np.triu(a)

LINALG = {
    'solve_triangular lower': (lambda a, b: linalg.solve_triangular(a, b, lower=True), (tri(3, True), rng.standard_normal((3, 2)))),
    'solve_triangular upper, vector': (lambda a, b: linalg.solve_triangular(a, b), (tri(3, False), rng.standard_normal(3))),
    'solve_triangular trans': (lambda a, b: linalg.solve_triangular(a, b, trans='T', lower=True), (tri(3, True), rng.standard_normal((3, 2)))),
    'solve_triangular unit diagonal': (lambda a, b: linalg.solve_triangular(a, b, lower=True, unit_diagonal=True),
                                       (tri(3, True), rng.standard_normal(3))),
    'cho_factor + cho_solve': (lambda a, b: linalg.cho_solve(linalg.cho_factor(a), b), (spd(3), rng.standard_normal((3, 2)))),
    'cho_factor lower + cho_solve': (lambda a, b: linalg.cho_solve(linalg.cho_factor(a, lower=True), b), (spd(3), rng.standard_normal(3))),
    'expm': (lambda a: linalg.expm(a), (rng.standard_normal((3, 3)) * 0.5,)),
}

@pytest.mark.parametrize('name', LINALG)
def test_linalg(name):
    f, args = LINALG[name]
    check(f, *args)
    check_second(f, *args, tol=1e-4)

SIGNAL = [(mode, s1, s2) for mode in ('full', 'valid', 'same') for s1, s2 in (((7,), (3,)), ((3,), (7,)), ((5, 4), (2, 3)))]

@pytest.mark.parametrize('mode, s1, s2', SIGNAL)
@pytest.mark.parametrize('which', ['convolve', 'correlate'])
def test_signal(which, mode, s1, s2):
    f = getattr(signal, which)
    a, b = rng.standard_normal(s1), rng.standard_normal(s2)
    g = lambda a, b: f(a, b, mode=mode)
    np.testing.assert_allclose(fd.value_with_pullback(g, a, b)[0], g(a, b), atol=1e-12)
    check(g, a, b)
    check_second(g, a, b)

# --- how it reaches the user ----------------------------------------------------------------------------------------
def test_registrations_are_listed_and_undoable():
    table = fd.supported_functions()
    assert 'scipy.stats.norm.logpdf' in table['scipy.stats'] and 'scipy.special.gammaln' in table['scipy.special']
    try:
        S.unregister_scipy()
        assert 'scipy.stats' not in fd.supported_functions()
        with pytest.raises(fd.DifferentiationError):           # SciPy's own code meets a traced value again
            fd.gradient(lambda x: np.sum(stats.norm.logpdf(x)), X)
        assert stats.norm.logpdf(0.0) == pytest.approx(-0.5 * np.log(2 * np.pi))
    finally:
        for module in ('scipy.special', 'scipy.stats', 'scipy.linalg', 'scipy.signal'): S.register_scipy(module)
    assert fd.gradient(lambda x: np.sum(stats.norm.logpdf(x)), X) == pytest.approx(-X)

PLAIN = [lambda x: stats.norm.logpdf(x, 0.3, scale=2.0), lambda x: stats.norm.logpdf(0.5), lambda x: special.logsumexp(x),
         lambda x: stats.multivariate_normal.logpdf(x[:3], cov=spd(3)), lambda x: special.softmax(x),
         lambda x: linalg.expm(np.outer(x, x) * 0.1), lambda x: signal.convolve(x, x[:3], mode='same'),
         lambda x: stats.poisson.logpmf(3, np.abs(x)), lambda x: stats.t.logpdf(x, df=3)]

def test_plain_calls_are_untouched():
    "With the rules in force and without them, SciPy gives the same results, of the same types, on plain arrays."
    x = rng.standard_normal(7)
    with_rules = [f(x) for f in PLAIN]
    try:
        S.unregister_scipy()
        without = [f(x) for f in PLAIN]
    finally:
        for module in ('scipy.special', 'scipy.stats', 'scipy.linalg', 'scipy.signal'): S.register_scipy(module)
    for a, b in zip(with_rules, without):
        assert type(a) is type(b) and np.array_equal(a, b), (a, b)

def test_a_user_derivative_replaces_a_rule_and_undo_restores_it():
    with fd.derivative(of=special.expit, vjp=lambda x: (special.expit(x), lambda g: g * 0 + 7.0)):
        assert fd.gradient(lambda x: np.sum(special.expit(x)), X) == pytest.approx(np.full(5, 7.0))
    s = special.expit(X)
    assert fd.gradient(lambda x: np.sum(special.expit(x)), X) == pytest.approx(s * (1 - s))

def test_a_special_function_without_a_rule_names_scipy():
    with pytest.raises(fd.NoDerivativeError) as e:
        fd.gradient(lambda x: np.sum(special.struve(1, x)), POSITIVE)
    assert 'scipy.special.struve has no derivative in fastad' in str(e.value)
    assert '@fastad.derivative(of=scipy.special.struve)' in str(e.value)
    with pytest.raises(fd.NoDerivativeError, match=r"numpy\.nextafter has no derivative"):   # NumPy's keep their name
        fd.gradient(lambda x: np.sum(np.nextafter(x, 0)), POSITIVE)

def test_fastad_works_and_imports_no_scipy_when_scipy_is_missing():
    "A finder that refuses every scipy module: fastad imports, differentiates, and its rules wait for a SciPy that never comes."
    code = textwrap.dedent("""
        import sys, importlib.abc
        class NoScipy(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == 'scipy' or name.startswith('scipy.'): raise ModuleNotFoundError(f"No module named {name!r}")
        sys.meta_path.insert(0, NoScipy())
        import numpy as np, fastad as fd
        assert not any(m == 'scipy' or m.startswith('scipy.') for m in sys.modules), sorted(sys.modules)
        assert fd.gradient(lambda x: np.sum(np.sin(x)), np.zeros(3)).tolist() == [1.0, 1.0, 1.0]
        assert not any(k.startswith('scipy') for k in fd.supported_functions())
        try: import scipy.stats
        except ImportError: print('ok')
    """)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr

def test_importing_fastad_imports_no_scipy_and_scipy_imported_later_is_differentiated():
    code = textwrap.dedent("""
        import sys, numpy as np, fastad as fd
        assert 'scipy' not in sys.modules
        from scipy import stats
        print(fd.gradient(lambda m: np.sum(stats.norm.logpdf(np.array([1.0, 2.0]), m, 1.0)), 0.5))
    """)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and float(out.stdout) == pytest.approx(2.0), out.stderr

def test_a_registered_function_called_on_plain_values_is_not_bound_to_its_vjp():
    "Plain values go straight to the function as written: keywords the VJP does not name, SciPy's own errors."
    def scaled(x, *args, **kwds): return x * kwds.get('scale', 1.0)
    with fd.derivative(of=scaled, vjp=lambda x: (x, lambda g: g)):     # a VJP narrower than the function
        assert scaled(2.0, scale=3.0) == 6.0                         # before: "these arguments do not fit its VJP (x)"
    with pytest.raises(TypeError):                                    # SciPy's error, not fastad's
        special.logsumexp(np.ones(3), nonsense=1)

def test_checkpoints_hold_no_more_with_scipys_rules_in_force():
    """Each checkpoint keeps the rules in force (to recompute under them): with SciPy's ~35, one snapshot shared by
    all, not one each (40 checkpoints held 499 KB with them against 311 KB without; now the same)."""
    from fastad.memory import held_bytes
    from fastad.backend import random_normal, manual_seed
    manual_seed(0)
    w, h = random_normal((64, 64)) / 8, random_normal((16, 64))
    cell = lambda h: np.tanh(h @ w)
    def loop(c):
        def f(h):
            for _ in range(40): h = c(h)
            return h.sum()
        return f
    checkpointed = loop(fd.make_recomputed_in_gradient(cell))
    fd.gradient(checkpointed, h)
    assert len(fd.transforms.rules_in_force()) > 30
    with_rules = held_bytes(checkpointed, h)
    try:
        S.unregister_scipy()
        fd.gradient(checkpointed, h)
        without = held_bytes(checkpointed, h)
    finally:
        for module in ('scipy.special', 'scipy.stats', 'scipy.linalg', 'scipy.signal'): S.register_scipy(module)
    assert with_rules - without < 40 * 512, (with_rules, without)
    assert fd.transforms.rules_in_force() is fd.transforms.rules_in_force()


@pytest.mark.parametrize('n', [1, 2.0, 1.5, -1, 171, np.int64(3)])
def test_polygamma_of_one_order_as_scipy(n):
    "One order, a number: SciPy's values, nan and inf included (a non-integer or negative order, an overflow)."
    x = np.array([0.5, 1.5, 4.0])
    with np.errstate(all='ignore'):
        value = fd.value_with_pullback(lambda x: special.polygamma(n, x), x)[0]
        np.testing.assert_allclose(value, special.polygamma(n, x), rtol=1e-12)


# --- edges: zero weights, singular covariances, Python floats, frozen distributions, cholesky ----------------------
def test_logsumexp_entries_with_weight_zero_set_no_shift():
    "A weight of 0 leaves its entry out (SciPy, JAX): logsumexp([1000, 1], b=[0, 1]) is 1, with slope [0, 1] in a."
    for b in ([0, 1], np.array([0.0, 1.0])):
        value, g = fd.value_with_gradient(lambda a: special.logsumexp(a, b=b), np.array([1000.0, 1.0]))
        np.testing.assert_equal((value, g), (special.logsumexp([1000.0, 1.0], b=b), [0.0, 1.0]))
    # in b, the slope is exp(a - result) where b is 0 too, as central differences of SciPy's give it
    a, b = np.array([3.0, 1.0, 2.0, -np.inf]), np.array([0.0, 1.0, 0.5, 0.0])
    check(lambda a, b: special.logsumexp(a, b=b), a[:3], b[:3])
    check(lambda b: special.logsumexp(a[:3], axis=0, b=b), b[:3])
    g = fd.gradient(lambda a: special.logsumexp(a, b=b), a)
    np.testing.assert_allclose(g, b * np.exp(a - special.logsumexp(a, b=b)))    # 0 where b is 0, and no NaN at -inf

@pytest.mark.parametrize('backend', BACKENDS)
def test_logsumexp_weight_zero_second_order(backend):
    "A weight of 0 sets no shift, yet its slope exp(a₀ - result) moves with a and b: the Hessian in (a, b) is right."
    a, b = np.array([1.0, 2.0, 0.5]), np.array([0.0, 1.0, 2.0])
    f = lambda a, b: special.logsumexp(a, b=b)
    with use_backend(backend):
        H = np.block([[to_host(h) for h in row] for row in fd.hessian(f, to_device(a), to_device(b))])   # a₀..a₂ b₀..b₂
    def grad(z): return np.concatenate(fd.gradient(f, z[:3], z[3:], argnums=(0, 1)))
    z, eps = np.concatenate([a, b]), 1e-6
    numeric = np.stack([(grad(z + eps * d) - grad(z - eps * d)) / (2 * eps) for d in np.eye(6)], axis=1)
    np.testing.assert_allclose(H, numeric, atol=1e-8)
    np.testing.assert_allclose(H[:, 3], [.2544, -.1759, -.0785, -.0647, -.1759, -.0392], atol=1e-4)   # was all 0
    check_second(f, a, b, backend=backend)

def _pseudo_case(seed=0):
    "A covariance of rank 2 in 3 dimensions, a mean, and a point in the support."
    r = np.random.default_rng(seed)
    B = r.standard_normal((3, 2))
    mean = r.standard_normal(3)
    return B, B @ B.T, mean, mean + B @ np.array([0.3, -0.7])

def test_multivariate_normal_allow_singular_follows_scipy():
    "SciPy's allow_singular=True: pseudo-determinant, pseudo-inverse and rank over the eigenvalues above its cutoff."
    f = lambda x, m, c: stats.multivariate_normal.logpdf(x, m, c, allow_singular=True)
    check(f, X[:3], X[2:], spd(3))                                  # full rank: every direction
    np.testing.assert_allclose(fd.value_with_pullback(f, X[:3], X[2:], spd(3))[0], f(X[:3], X[2:], spd(3)), rtol=1e-12)
    B, C, mean, x = _pseudo_case()
    points = np.stack([x, x + np.array([1.0, 0.0, 0.0])])           # in the support, and off it (-inf)
    value, (gx, gm, gc) = fd.value_with_gradient(lambda x, m, c: f(x, m, c).sum(), x, mean, C, argnums=(0, 1, 2))
    np.testing.assert_allclose(value, f(x, mean, C), rtol=1e-12)
    np.testing.assert_allclose(fd.value_with_pullback(lambda p: f(p, mean, C), points)[0], f(points, mean, C), rtol=1e-12)
    # the rank is SciPy's; where it holds (cov moved within its range, x within the support) central differences agree
    r = np.random.default_rng(1)
    A = r.standard_normal((2, 2))
    dC, dx, dm = B @ (A + A.T) @ B.T, B @ r.standard_normal(2), B @ r.standard_normal(2)
    eps = 1e-6
    numeric = (f(x + eps * dx, mean + eps * dm, C + eps * dC) - f(x - eps * dx, mean - eps * dm, C - eps * dC)) / (2 * eps)
    assert np.sum(gx * dx) + np.sum(gm * dm) + np.sum(gc * dC) == pytest.approx(numeric, rel=1e-6)
    assert np.allclose(np.triu(gc, 1), 0)                           # SciPy reads the lower triangle
    g_off = fd.gradient(lambda p: f(p, mean, C)[1], points)         # off the support: -inf, flat, no NaN
    np.testing.assert_equal(g_off, np.zeros((2, 3)))

def test_multivariate_normal_allow_singular_exactly_and_nearly_singular():
    "Before, the flag was ignored: a LinAlgError where cov is singular, a value far from SciPy's where it nearly is."
    f = lambda x, c: stats.multivariate_normal.logpdf(x, np.zeros(2), c, allow_singular=True)
    x = np.array([0.5, 0.5])
    for c in (np.ones((2, 2)), np.array([[1.0, 1.0], [1.0, 1.0 + 1e-12]])):
        value, (gx, gc) = fd.value_with_gradient(f, x, c, argnums=(0, 1))
        np.testing.assert_allclose(value, f(x, c), rtol=1e-12)       # -1.3905..., rank 1, as SciPy
        np.testing.assert_allclose(gx, [-0.25, -0.25])               # -pinv(c) x
        np.testing.assert_allclose(gc, [[-0.09375, 0.0], [-0.1875, -0.09375]])
    with pytest.raises(fd.ArgumentError, match='positive semidefinite'):
        fd.gradient(lambda c: f(x, c), np.array([[1.0, 2.0], [2.0, 1.0]]))

@pytest.mark.parametrize('f, x', [(special.logit, 0.0), (special.logit, 1.0),
                                  (lambda s: stats.norm.logpdf(1.0, scale=s), 0.0),
                                  (lambda s: stats.norm.logpdf(1.0, 0.5, s), 0.0),
                                  (lambda d: stats.t.logpdf(1.0, df=d), 0.0)])
def test_python_floats_at_scipys_edges_give_scipys_inf_and_nan(f, x):
    "Where SciPy gives inf or NaN, a Python float gives the same (not a ZeroDivisionError), and the slope of np.float64."
    with np.errstate(all='ignore'):
        value, g = fd.value_with_gradient(f, x)
        value64, g64 = fd.value_with_gradient(f, np.float64(x))
        np.testing.assert_equal(value, f(x))
    np.testing.assert_equal((value, g), (value64, g64))
    check(f, 0.3 + 0.4 * x)                                         # beside the edge, central differences

def test_frozen_distributions():
    "Frozen with constants: differentiated in x. Frozen with traced parameters: refused, naming the unfrozen form."
    K = spd(3)
    frozen = stats.multivariate_normal(X[2:], K)
    check(lambda x: frozen.logpdf(x), X[:3])
    check(lambda x: frozen.pdf(x), X[:3])
    singular = stats.multivariate_normal(cov=np.ones((2, 2)), allow_singular=True)
    value, g = fd.value_with_gradient(singular.logpdf, np.array([0.3, 0.3]))
    np.testing.assert_allclose((value, *g), (singular.logpdf([0.3, 0.3]), -0.15, -0.15), rtol=1e-12)
    np.testing.assert_allclose(fd.value_with_pullback(frozen.logpdf, X[:3])[0], frozen.logpdf(X[:3]), rtol=1e-12)
    with pytest.raises(fd.NoDerivativeError, match=r'multivariate_normal\.logpdf\(x, mean, cov\) instead'):
        fd.gradient(lambda m: stats.multivariate_normal(m, K).logpdf(X[:3]), X[2:])
    with pytest.raises(fd.NoDerivativeError, match=r'dirichlet\.logpdf\(x, alpha\) instead'):
        fd.gradient(lambda a: stats.dirichlet(a).logpdf(np.array([0.2, 0.3, 0.5])), POSITIVE[:3])
    check(lambda x: stats.dirichlet(POSITIVE[:3]).logpdf(x / np.sum(x)), POSITIVE[3:])
    assert type(stats.multivariate_normal(X[2:], K)) is type(frozen)  # plain calls are SciPy's own
    names = fd.supported_functions()['scipy.stats']
    assert not any('__call__' in n for n in names) and 'scipy.stats.multivariate_normal(mean, cov).logpdf' in names

@pytest.mark.parametrize('lower', [False, True])
def test_scipy_linalg_cholesky(lower):
    "scipy.linalg.cholesky, upper by default: cho_factor's rule, on the triangle SciPy reads."
    check(lambda a: linalg.cholesky(a, lower=lower), spd(3))
    check(lambda a: linalg.cholesky(a, lower=lower), spd(3) + np.triu(np.ones((3, 3)), 1) * (1 if lower else 0))
    np.testing.assert_allclose(fd.value_with_pullback(lambda a: linalg.cholesky(a, lower=lower), spd(3))[0],
                               linalg.cholesky(spd(3), lower=lower), rtol=1e-12)
    check_second(lambda a: linalg.cholesky(a, lower=lower), spd(3))


# ---- SciPy's rules at their edges: polygamma orders, densities at their ends, xlogy, logsumexp ---------------------
def test_polygamma_with_orders_holding_zero_is_digamma_there():
    n, x = np.array([0, 1, 2]), np.array([2.0, 2.0, 0.7])
    value, grad = fd.value_with_gradient(lambda x: sp.polygamma(n, x).sum(), x)   # before: -inf, and NaN slopes
    np.testing.assert_allclose(value, sp.polygamma(n, x).sum())
    np.testing.assert_allclose(grad, sp.polygamma(n + 1, x))
    np.testing.assert_allclose(grad, numerical_gradient(lambda x: sp.polygamma(n, x).sum(), x), rtol=1e-5)

@pytest.mark.parametrize('dist, x, args, slope', [(st.beta, 0.0, (1, 2), -1.0), (st.beta, 1.0, (2, 1), 1.0),
                                                  (st.gamma, 0.0, (1,), -1.0)])
def test_a_density_whose_shape_is_1_is_finite_at_its_end(dist, x, args, slope):
    value, grad = fd.value_with_gradient(lambda x: dist.logpdf(x, *args), x)    # before: -inf, and a 0 slope
    np.testing.assert_allclose(value, dist.logpdf(x, *args))
    np.testing.assert_allclose(grad, slope)                                     # one-sided: the density's own formula

def test_densities_at_ends_and_inside_agree_with_scipy():
    for dist, args in [(st.beta, (0.5, 2)), (st.beta, (2, 2)), (st.beta, (2, 0.5)), (st.gamma, (0.5,)), (st.gamma, (2,))]:
        x = np.array([-0.1, 0.0, 0.3, 0.8, 1.0, 1.2])
        with np.errstate(all='ignore'):
            value = fd.value_with_pullback(lambda x: dist.logpdf(x, *args), x)[0]
        np.testing.assert_allclose(value, dist.logpdf(x, *args))
        inner = np.array([0.3, 0.8])
        np.testing.assert_allclose(fd.gradient(lambda x: dist.logpdf(x, *args).sum(), inner),
                                   numerical_gradient(lambda x: dist.logpdf(x, *args).sum(), inner), rtol=1e-5)

@pytest.mark.parametrize('fn, p, q', [(sp.xlogy, [0., 2., 0.], [0., 3., 2.]), (sp.xlog1py, [0., 2., 0.], [-1., 3., 1.])])
def test_xlogy_slope_in_y_is_zero_where_x_is_zero(fn, p, q):
    p, q = np.array(p), np.array(q)
    with np.errstate(all='ignore'):
        grad = fd.gradient(lambda q: fn(p, q).sum(), q)                          # before: NaN at the first
    np.testing.assert_allclose(grad, [0., 2 / (q[1] + (fn is sp.xlog1py)), 0.])
    np.testing.assert_allclose(grad[1:], numerical_gradient(lambda q: fn(p[1:], q).sum(), q[1:]), rtol=1e-6)

def test_logsumexp_over_an_empty_axis_is_minus_inf_as_scipy():
    a = np.zeros((2, 0))
    value, grad = fd.value_with_gradient(lambda a: sp.logsumexp(a, axis=1).sum(), a)   # before: NumPy's ValueError
    assert value == sp.logsumexp(a, axis=1).sum() == -np.inf and grad.shape == (2, 0)

def test_logsumexp_of_an_all_minus_inf_slice_has_zero_cotangents():
    a = np.array([[-np.inf, -np.inf], [0., 1.]])
    value, grad = fd.value_with_gradient(lambda a: sp.logsumexp(a, axis=1)[1] + 0 * sp.logsumexp(a, axis=1)[0], a)
    np.testing.assert_allclose(grad, [[0., 0.], [0.26894142, 0.73105858]])               # before: NaN in the first row
    np.testing.assert_allclose(grad[1], numerical_gradient(lambda r: sp.logsumexp(r), a[1]), rtol=1e-6)
    np.testing.assert_allclose(fd.gradient(lambda a: sp.logsumexp(a), np.array([-np.inf, -np.inf])), [0., 0.])
