"""One rule form: primitives and custom VJPs are called the same way, and one tape entry may hold
several outputs. Multi-output primitives (svd, eigh, qr, slogdet) against float64 central differences, at first and
second order, with only some of their outputs used; custom VJPs with several outputs and inputs; the names retired."""
import numpy as np, pytest
import fastad as fd
from fastad import engine, linalg, transforms
from fastad.engine import Recording, Outputs, backward
from fastad.testing import numerical_gradient
from fastad.primitives import unbroadcast


def spd(seed, n=3):
    "A symmetric positive definite matrix with well-separated eigenvalues."
    x = np.random.default_rng(seed).standard_normal((n, n))
    return x @ x.T + np.diag(np.arange(1.0, n + 1))

def general(seed, m=4, n=3): return np.random.default_rng(seed).standard_normal((m, n)) + np.eye(m, n) * 2

# Functions of the outputs that do not depend on the sign NumPy picks for each vector, each using some outputs only.
FIRST = {
    'svd: s only': (lambda a: np.linalg.svd(a, full_matrices=False)[1].sum(), general),
    'svd: u only': (lambda a: (np.linalg.svd(a, full_matrices=False)[0] ** 2 * np.arange(3.)).sum(), general),
    'svd: vh only': (lambda a: (np.linalg.svd(a, full_matrices=False)[2] ** 2 * np.arange(3.)).sum(), general),
    'svd: all three': (lambda a: (lambda u, s, vh: ((u * s) @ vh * np.arange(3.)).sum() + (s ** 2).sum())(
        *np.linalg.svd(a, full_matrices=False)), general),
    'eigh: w only': (lambda a: (np.linalg.eigh(a)[0] ** 2).sum(), spd),
    'eigh: v only': (lambda a: (np.linalg.eigh(a)[1] ** 2 * np.arange(3.)).sum(), spd),
    'eigh: both': (lambda a: (lambda w, v: ((v * w) @ v.T * np.arange(3.)).sum())(*np.linalg.eigh(a)), spd),
    'qr: r only': (lambda a: (np.linalg.qr(a)[1] ** 2).sum(), general),
    'qr: mode r': (lambda a: (np.linalg.qr(a, mode='r') ** 3).sum(), general),
    'qr: q only': (lambda a: (np.linalg.qr(a)[0] ** 2 * np.arange(3.)).sum(), general),
    'slogdet: logabsdet only': (lambda a: np.linalg.slogdet(a)[1], spd),
    'slogdet: both': (lambda a: np.linalg.slogdet(a)[0] * np.linalg.slogdet(a)[1] ** 2, spd),
}

@pytest.mark.parametrize('name', FIRST)
def test_multi_output_primitives_first_order(name):
    f, make = FIRST[name]
    a = make(1)
    np.testing.assert_allclose(fd.gradient(f, a), numerical_gradient(f, a), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize('name', ['svd: s only', 'svd: u only', 'svd: all three', 'eigh: w only', 'eigh: v only',
                                  'eigh: both', 'qr: r only', 'qr: q only', 'slogdet: logabsdet only'])
def test_multi_output_primitives_second_order(name):
    "The gradient of a gradient's projection: through the chain of a several-output entry, recorded by an outer level."
    f, make = FIRST[name]
    a, v = make(2), np.random.default_rng(3).standard_normal(make(2).shape)
    along = lambda a: (fd.gradient(f, a) * v).sum()          # a Hessian-vector product, as a gradient
    np.testing.assert_allclose(fd.gradient(along, a), numerical_gradient(along, a, eps=1e-5), rtol=1e-4, atol=1e-5)

def test_one_entry_holds_every_output():
    t = Recording()
    a = t.new_input(general(0))
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    t.active = False
    entry = t.tape[u.idx]
    assert type(entry) is Outputs and entry[0] == 'svd' and len(entry.specs) == 3
    assert (s.idx, vh.idx) == (u.idx + 1, u.idx + 2) and t.tape[s.idx] == t.tape[vh.idx] == u.idx
    assert len(t.tape) == 4                                   # the input, and three outputs of one entry: no packing

def test_unused_outputs_get_zeros_in_one_call():
    "The pullback of a several-output rule runs once per backward pass, with zeros for the outputs nobody used."
    seen = []
    def two(x):
        def pullback(gs):
            seen.append([np.asarray(g).copy() for g in gs])
            return 2 * x * gs[0] + 3 * gs[1]
        return (x * x, 3 * x), pullback
    prim = fd.primitives.Primitive('two', two)
    x = np.array([1., 2.])
    test = lambda x: prim(x)[1].sum()
    np.testing.assert_allclose(fd.gradient(test, x), [3., 3.])
    assert len(seen) == 1 and np.array_equal(seen[0][0], [0., 0.]) and np.array_equal(seen[0][1], [1., 1.])
    seen.clear()
    np.testing.assert_allclose(fd.gradient(lambda x: (prim(x)[0] * prim(x)[1]).sum(), x), 9 * x ** 2)   # 3x³
    assert len(seen) == 2                                     # two calls of the rule: two entries, each run once

def test_custom_vjp_with_several_outputs_and_inputs():
    calls = []
    @fd.differentiable_function
    def polar(x, y):
        "(r, θ) of the point (x, y): two outputs from two inputs."
        r, th = np.hypot(x, y), np.arctan2(y, x)
        def pullback(g):
            calls.append(1)
            gr, gth = g
            return gr * x / r - gth * y / r ** 2, gr * y / r + gth * x / r ** 2
        return (r, th), pullback
    x, y = np.array([1., 2., -1.]), np.array([0.5, -1., 3.])
    def f(x, y):
        r, th = polar(x, y)
        return (r * np.sin(th)).sum()                         # = y.sum()
    gx, gy = fd.gradient(f, x, y)
    np.testing.assert_allclose(gx, 0 * x, atol=1e-12); np.testing.assert_allclose(gy, np.ones(3))
    assert len(calls) == 1                                    # one pullback call for both inputs and both outputs
    only_theta = lambda x, y: polar(x, y)[1].sum()            # r unused: its cotangent arrives as zeros
    for got, want in zip(fd.gradient(only_theta, x, y), numerical_gradient(only_theta, x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    gy_only = fd.gradient(lambda y: polar(x, y)[0].sum(), y)  # x a constant: its cotangent is dropped
    np.testing.assert_allclose(gy_only, y / np.hypot(x, y))

def test_custom_vjp_several_outputs_second_order():
    @fd.differentiable_function
    def sq_cube(x):
        return (x ** 2, x ** 3), lambda g: 2 * x * g[0] + 3 * x ** 2 * g[1]
    f = lambda x: (sq_cube(x)[1] * sq_cube(x)[0]).sum()       # x⁵: second derivative 20 x³
    x = np.array([0.5, 1.5])
    np.testing.assert_allclose(fd.gradient(lambda x: fd.gradient(f, x).sum(), x), 20 * x ** 3)

def test_custom_vjp_with_structured_output():
    @fd.differentiable_function
    def stats(x):
        return {'mean': x.mean(), 'centred': x - x.mean()}, lambda g: g['mean'] / x.size + g['centred'] - g['centred'].mean()
    x = np.array([1., 4., 2.])
    f = lambda x: (stats(x)['centred'] ** 2).sum() + stats(x)['mean']
    np.testing.assert_allclose(fd.gradient(f, x), numerical_gradient(f, x), rtol=1e-6)

def test_one_pullback_for_all_inputs_is_one_parent():
    "A custom VJP's pullback is one parent of its entry, whose place is the tuple of the inputs' places."
    def mul_vjp(x, y): return x * y, lambda g: (g * y, g * x)
    mul = fd.differentiable_function(mul_vjp)
    t = Recording()
    x, y = t.new_input(np.ones(2)), t.new_input(np.full(2, 3.))
    z = mul(x, y)
    t.active = False
    (places, _), = t.tape[z.idx][1]
    assert places == (x.idx, y.idx)
    cts = backward(t, {z.idx: np.ones(2)})
    np.testing.assert_allclose(cts[x.idx], [3., 3.]); np.testing.assert_allclose(cts[y.idx], [1., 1.])

def test_custom_rule_of_an_operator_takes_the_fast_paths():
    "`a + b` and `a + 2.0` reach a custom rule of np.add through the operators' fast paths: one pullback for both."
    def add_vjp(x, y): return x + y, lambda g: (unbroadcast(2 * g, np.shape(x)), unbroadcast(3 * g, np.shape(y)))
    with fd.derivative(of=np.add, vjp=add_vjp):
        assert fd.gradient(lambda a, b: (a + b).sum(), np.ones(2), np.ones(2))[1].tolist() == [3., 3.]
        assert fd.gradient(lambda a: (a + 2.0).sum(), np.ones(2)).tolist() == [2., 2.]
        assert fd.gradient(lambda a: (2.0 + a).sum(), np.ones(2)).tolist() == [3., 3.]

def test_retired_names_are_gone():
    for module, name in [(transforms, '_split_chain'), (transforms, '_mark_wanted'), (transforms, '_Parts'),
                         (transforms, '_part'), (linalg, 'packed'), (linalg, '_pack'), (linalg, '_unpack')]:
        assert not hasattr(module, name), f"{module.__name__}.{name}"
    assert 'packed' not in linalg.__all__

def test_no_per_thread_memo_in_custom_chains():
    "Nothing per thread is held between sweeps: a custom function's pullback is a plain function on the tape."
    import threading
    def f_vjp(x, y): return x * y, lambda g: (g * y, g * x)
    f = fd.differentiable_function(f_vjp)
    t = Recording()
    x, y = t.new_input(np.ones(2)), t.new_input(np.ones(2))
    z = f(x, y)
    (_, pullback), = t.tape[z.idx][1]
    cells = [c.cell_contents for c in pullback.__closure__ or ()]
    assert not any(isinstance(c, threading.local) for c in cells)


def test_what_a_chain_reads_is_found_in_its_closure_never_declared():
    "One way to know what a chain keeps: the closure. No `keeps=` on `defvwc` or `Primitive`, no `kept` on a rule."
    import inspect
    from fastad import primitives as P, locks
    assert 'keeps' not in inspect.signature(P.defvwc).parameters and 'keeps' not in inspect.signature(P.Primitive).parameters
    assert not any(hasattr(row.primitive, 'kept') or hasattr(row.primitive, 'keeps') for row in P.REGISTRY.values())
    x, y = np.ones(2), np.full(2, 3.)
    _, (dx, dy) = P.multiply_vwc(x, y)
    assert (locks.keeps(dx, y), locks.keeps(dx, x), locks.keeps(dy, x)) == (True, False, True)
    assert not any(locks.keeps(c, a) for c in P.add_vwc(x, y)[1] for a in (x, y))
