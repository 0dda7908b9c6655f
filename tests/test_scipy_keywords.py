"""Traced arguments passed by keyword to a registered derivative (`loc=mu`), and SciPy's frozen distributions.

A VJP registered with `fastad.derivative(of=f)` receives the call's keyword arguments as keywords; its pullback gives
their cotangents in a dict after the positional ones. The SciPy rules use that for `loc=`, `scale=`, `df=`, `a=`, ...
Each case is checked against float64 central differences (second order for norm).
"""
import numpy as np, pytest
import fastad as fd
from fastad.errors import DifferentiationError

# Its own: one directional difference along a random direction, far cheaper than numerical_gradient's every coordinate.
def central(f, xs, i, v, d, eps=1e-6):
    "The derivative of <v, f(xs)> along d in argument i, by central differences."
    def at(t): return float(np.sum(v * f(*xs[:i], xs[i] + t * d, *xs[i + 1:])))
    return (at(eps) - at(-eps)) / (2 * eps)

def check(f, *xs, tol=1e-6, seed=0):
    "fd.pullback of f at xs against central differences, argument by argument."
    rng = np.random.default_rng(seed)
    xs = [np.asarray(x, np.float64) for x in xs]
    value, pb = fd.value_with_pullback(f, *xs)
    v = rng.standard_normal(np.shape(value))
    grads = pb(v)
    grads = grads if len(xs) > 1 else (grads,)
    for i, g in enumerate(grads):
        assert np.shape(g) == xs[i].shape, (i, np.shape(g), xs[i].shape)
        d = rng.standard_normal(xs[i].shape)
        numeric, analytic = central(f, xs, i, v, d), float(np.sum(g * d))
        assert abs(analytic - numeric) <= tol * max(1.0, abs(numeric)), (i, analytic, numeric)

# ---- the mechanism, on a user's function -------------------------------------------------------------------------

def shifted(x, **kwds):
    "x scaled and shifted, its parameters by keyword only."
    return (x - kwds.get('loc', 0.0)) * kwds.get('scale', 1.0)

def test_keyword_cotangents_in_a_dict():
    def shifted_vjp(x, **kwds):
        loc, scale = kwds.get('loc', 0.0), kwds.get('scale', 1.0)
        def pullback(g):
            cts = {k: (-g * scale).sum() if k == 'loc' else (g * (x - loc)).sum() for k in kwds}
            return g * scale, cts
        return shifted(x, **kwds), pullback
    with fd.derivative(of=shifted, vjp=shifted_vjp):
        x = np.array([1.0, 2.0, 4.0])
        check(lambda x, mu, s: shifted(x, loc=mu, scale=s), x, 0.5, 3.0)
        check(lambda mu: shifted(x, loc=mu), 0.5)
        g = fd.gradient(lambda mu: shifted(x, loc=mu).sum(), 0.5)
        assert g == -3.0

def test_keyword_only_parameter():
    def scaled(x, *, scale=1.0): return x * scale
    @fd.derivative(of=scaled)
    def scaled_vjp(x, *, scale=1.0): return x * scale, lambda g: (g * scale, {'scale': np.sum(g * x)})
    try:
        check(lambda x, s: scaled(x, scale=s), np.array([1.0, -2.0]), 3.0)
        assert fd.gradient(lambda s: scaled(2.0, scale=s), 3.0) == 2.0
    finally: fd.registered_derivative(scaled).undo()

def test_positional_convention_unchanged():
    "A VJP written for positions: a keyword that names a positional parameter is that parameter, as before."
    def mul(x, y): return x * y
    with fd.derivative(of=mul, vjp=lambda x, y: (x * y, lambda g: (g * y, g * x))):
        assert fd.gradient(lambda y: mul(2.0, y=y), 3.0) == 2.0
        assert fd.gradient(lambda x: mul(y=3.0, x=x), 2.0) == 3.0

def test_traced_keyword_without_cotangent_is_an_error():
    "A VJP that gives no cotangent for a traced keyword: an error naming the function and the argument."
    with fd.derivative(of=shifted, vjp=lambda x, **kw: (shifted(x, **kw), lambda g: g)):
        with pytest.raises(DifferentiationError, match=r"shifted.*loc"):
            fd.gradient(lambda mu: shifted(1.0, loc=mu), 0.5)
        assert fd.gradient(lambda x: shifted(x, loc=0.5), 1.0) == 1.0        # a plain keyword needs none

def test_keyword_cotangent_for_an_argument_not_given():
    with fd.derivative(of=shifted, vjp=lambda x, **kw: (shifted(x, **kw), lambda g: (g, {'loc': g, 'oops': g}))):
        with pytest.raises(DifferentiationError, match=r"shifted.*oops"):
            fd.gradient(lambda mu: shifted(1.0, loc=mu), 0.5)

def test_second_order_through_a_keyword():
    def sq(x, **kw): return x * kw['k'] ** 2
    with fd.derivative(of=sq, vjp=lambda x, **kw: (sq(x, **kw), lambda g: (g * kw['k'] ** 2, {'k': g * x * 2 * kw['k']}))):
        assert fd.gradient(fd.gradient(lambda k: sq(3.0, k=k)), 2.0) == 6.0

# ---- SciPy -------------------------------------------------------------------------------------------------------

scipy = pytest.importorskip('scipy', reason="SciPy is optional; these check fastad's rules for it")
from scipy import stats

X = np.array([-1.2, 0.3, 0.9, 2.5])

@pytest.mark.parametrize('method', ['logpdf', 'pdf', 'cdf', 'logcdf', 'sf'])
def test_norm_loc_scale_by_keyword(method):
    m = getattr(stats.norm, method)
    check(lambda x, mu, s: m(x, loc=mu, scale=s), X, 0.4, 1.7)
    check(lambda x, mu, s: m(x, mu, scale=s), X, 0.4, 1.7)
    check(lambda mu: m(X, loc=mu), 0.4)

def test_norm_second_order_by_keyword():
    w = np.array([0.3, -1.0, 2.0, 0.5])
    def f(mu, s): return np.sum(w * stats.norm.logpdf(X, loc=mu, scale=s))
    for i in (0, 1):
        check(lambda mu, s: fd.gradient(f, mu, s)[i], 0.4, 1.7, tol=1e-5)

def test_shapes_by_keyword():
    pos = np.array([0.2, 0.9, 1.7, 3.0])
    check(lambda x, df, mu, s: stats.t.logpdf(x, df=df, loc=mu, scale=s), X, 3.5, 0.2, 1.3)
    check(lambda x, a, s: stats.gamma.logpdf(x, a=a, scale=s), pos, 2.5, 1.5)
    check(lambda x, a, b: stats.beta.logpdf(x, a=a, b=b), np.array([0.1, 0.4, 0.8]), 2.0, 3.5)
    check(lambda mu: stats.poisson.logpmf(np.array([0, 2, 5]), mu=mu), 2.5)

def test_multivariate_keywords():
    x = np.array([[0.3, -0.2], [1.0, 0.5]])
    cov = np.array([[1.5, 0.3], [0.3, 0.8]])
    check(lambda x, m, c: stats.multivariate_normal.logpdf(x, mean=m, cov=c), x, np.array([0.1, 0.2]), cov)
    check(lambda a: stats.dirichlet.logpdf(np.array([0.2, 0.3, 0.5]), alpha=a), np.array([1.5, 2.0, 3.0]))

# ---- frozen distributions ----------------------------------------------------------------------------------------

@pytest.mark.parametrize('method', ['logpdf', 'pdf', 'cdf', 'logcdf', 'sf'])
def test_frozen_norm(method):
    check(lambda x, mu, s: getattr(stats.norm(mu, s), method)(x), X, 0.4, 1.7)
    check(lambda x, mu, s: getattr(stats.norm(loc=mu, scale=s), method)(x), X, 0.4, 1.7)

def test_frozen_norm_second_order():
    def f(mu, s): return np.sum(stats.norm(loc=mu, scale=s).logpdf(X))
    for i in (0, 1):
        check(lambda mu, s: fd.gradient(f, mu, s)[i], 0.4, 1.7, tol=1e-5)

def test_frozen_shapes():
    pos = np.array([0.2, 0.9, 1.7, 3.0])
    check(lambda x, df, mu: stats.t(df, loc=mu).logpdf(x), X, 3.5, 0.2)
    check(lambda x, a, s: stats.gamma(a, scale=s).logpdf(x), pos, 2.5, 1.5)
    check(lambda x, a, b: stats.beta(a, b).logpdf(x), np.array([0.1, 0.4, 0.8]), 2.0, 3.5)
    check(lambda mu: stats.poisson(mu).logpmf(np.array([0, 2, 5])), 2.5)

def test_a_structured_argument_with_a_plain_keyword():
    "One positional argument, a tuple of one, and a constant keyword: its cotangent is a tuple of one, as before."
    def squared(p, *, scale): return p[0] ** 2 * scale
    with fd.derivative(of=squared, vjp=lambda p, *, scale: (squared(p, scale=scale), lambda g: (2 * g * p[0] * scale,))):
        assert fd.gradient(lambda p: squared(p, scale=2.0), (3.0,)) == (12.0,)
