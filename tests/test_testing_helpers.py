"""fastad.testing's derivative checks: numerical_gradient agrees with fastad's gradients, and check_vwc passes
every right VWC and fails each kind of wrong one with a message that says where."""
import functools
import numpy as np, pytest
from hypothesis import given, settings, strategies as st
import fastad as fd
from fastad import primitives as P
from fastad.backend import to_device, to_host
from fastad.errors import ArgumentError, DifferentiationError
from fastad.testing import numerical_gradient, check_vwc

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=2).map(tuple)

@settings(max_examples=20, deadline=None)
@given(shapes, st.integers(0, 2**31))
def test_numerical_gradient_agrees_with_fastad(shape, seed):
    x = np.random.default_rng(seed).uniform(0.5, 2.0, shape)
    f = lambda x: (np.sin(x) * np.log(x) + x ** 2).sum()
    np.testing.assert_allclose(numerical_gradient(f, x), fd.gradient(f, x), rtol=1e-7, atol=1e-8)

def test_numerical_gradient_keeps_structure_and_types():
    x32 = np.array([1., 2.], dtype=np.float32)
    g = numerical_gradient(lambda a, p: a * (p['w'] ** 2).sum() + p['b'], 3.0, {'w': x32, 'b': 1.0})
    assert type(g) is tuple and type(g[0]) is float and set(g[1]) == {'w', 'b'}
    assert g[1]['w'].dtype == np.float64                     # differences are taken in float64, always
    np.testing.assert_allclose(g[1]['w'], [6., 12.]); assert abs(g[1]['b'] - 1) < 1e-8

def test_numerical_gradient_refuses_what_has_no_gradient():
    with pytest.raises(ArgumentError, match="returned a result of shape \\(2,\\), not a scalar"):
        numerical_gradient(lambda x: x, np.ones(2))
    with pytest.raises(DifferentiationError, match="argument 1 is an integer"):
        numerical_gradient(lambda x, n: x * n, 1.0, 3)

def test_numerical_gradient_on_each_backend(any_backend):
    x = to_device(np.array([0.3, -1.2]))
    g = numerical_gradient(lambda x: np.tanh(x).sum(), x)
    assert type(g) is type(x)                                # back on the device it came from
    np.testing.assert_allclose(to_host(g), 1 - np.tanh(to_host(x)) ** 2, rtol=1e-8)

UNARY = [('exp', P.exp_vwc, None), ('sin', P.sin_vwc, None), ('tanh', P.tanh_vwc, None), ('sqrt', P.sqrt_vwc, 0.1),
         ('log', P.log_vwc, 0.1), ('square', P.square_vwc, None), ('expm1', P.expm1_vwc, None)]

@pytest.mark.parametrize('name,vwc,low', UNARY, ids=[u[0] for u in UNARY])
def test_check_vwc_passes_fastads_own_primitives(name, vwc, low):
    x = np.random.default_rng(1).uniform(low if low is not None else -2, 2, (3, 2))
    assert check_vwc(vwc, x) < 1e-6

def test_check_vwc_passes_primitives_with_keywords_and_two_arguments():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    check_vwc(P.matmul_vwc, a, b)
    check_vwc(functools.partial(P.sum_vwc, axis=0), a)
    check_vwc(P.divide_vwc, a, rng.uniform(1, 2, (3, 4)))

def test_check_vwc_checks_float32_arguments_in_float64():
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    assert check_vwc(lambda x: (np.tanh(x), lambda v: v * (1 - np.tanh(x) ** 2)), x) < 1e-8

def test_check_vwc_takes_no_cotangent_as_zero():
    x, c = np.array([1., 2.]), np.array([3., 4.])
    check_vwc(lambda x, c: (x * 0 + c, (None, lambda v: v)), x, c)         # x does not matter: None is right
    with pytest.raises(AssertionError, match="the cotangent of argument 0 is wrong"):
        check_vwc(lambda x, c: (x * c, (None, lambda v: v * x)), x, c)     # x matters: None is wrong

WRONG = [
    ('a wrong derivative', lambda x: (np.sin(x), lambda v: v * np.sin(x)), "the cotangent of argument 0 is wrong: worst error"),
    ('a missing factor of v', lambda x: (np.sin(x), lambda v: np.cos(x)), "the cotangent of argument 0 is wrong"),
    ('no chain', lambda x: np.sin(x), "a VWC returns (value, chain)"),
    ('a chain that is not a function', lambda x: (np.sin(x), 3), "the chain is int, not a function"),
    ('a cotangent of the wrong shape', lambda x: (np.sin(x).sum(), lambda v: v), "has shape (), but argument 0 has shape (3,)"),
]

@pytest.mark.parametrize('what,vwc,message', WRONG, ids=[w[0] for w in WRONG])
def test_check_vwc_fails_a_wrong_vwc_naming_what_is_wrong(what, vwc, message):
    with pytest.raises(AssertionError) as e: check_vwc(vwc, np.array([0.1, 0.7, -1.3]))
    assert message in str(e.value), str(e.value)

def test_check_vwc_counts_the_cotangents_of_several_arguments():
    x, y = np.ones(2), np.ones(2)
    with pytest.raises(AssertionError, match="should return 2 cotangents, one per argument"):
        check_vwc(lambda x, y: (x * y, lambda v: v * y), x, y)
    with pytest.raises(AssertionError, match="1 chains for 2 arguments"):
        check_vwc(lambda x, y: (x * y, (lambda v: v * y,)), x, y)

def test_check_vwc_names_the_argument_and_element_that_is_wrong():
    x, w = np.array([1., 2., 3.]), {'a': np.array([0.5, -0.5])}
    def vwc(x, p): return x.sum() * p['a'], lambda v: (np.full(3, (v * p['a']).sum()), {'a': v * x.sum() * (1 + (np.arange(2) == 1))})
    with pytest.raises(AssertionError, match=r"the cotangent of argument 1\['a'\] is wrong: worst error .* at index \(1,\)"):
        check_vwc(vwc, x, w)

def test_check_vwc_checks_the_value_against_f():
    x = np.array([0.1, 0.2])
    check_vwc(P.sin_vwc, x, f=np.sin)
    with pytest.raises(AssertionError): check_vwc(P.sin_vwc, x, f=np.cos)

def test_check_vwc_on_each_backend(any_backend):
    x = to_device(np.array([0.3, -1.2, 2.0]))
    check_vwc(P.tanh_vwc, x, f=np.tanh)
    with pytest.raises(AssertionError, match="is wrong"): check_vwc(lambda x: (np.tanh(x), lambda v: v), x)
