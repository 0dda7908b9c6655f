"Reference matmuls in `fastad.matmul`: agreement with `@`, shape errors, and backend independence."
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from fastad import strict
from fastad.backend import use_backend, to_device, to_host, random_normal, default_rng, xp
from fastad.errors import FastADError, HostTransferError, ShapeError
from fastad.matmul import check_matmul, matmul_loops, matmul_rows, matmul_broadcast, matmul_einsum

MATMULS = [matmul_loops, matmul_rows, matmul_broadcast, matmul_einsum]
ids = [f.__name__ for f in MATMULS]

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=64)

@st.composite
def matrix_pairs(draw, max_side=6):
    "Two float64 matrices `(n, k)` and `(k, m)`, any side from 0 to `max_side`."
    n, k, m = (draw(st.integers(0, max_side)) for _ in range(3))
    return draw(arrays(np.float64, (n, k), elements=finite)), draw(arrays(np.float64, (k, m), elements=finite))

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
@settings(max_examples=60, deadline=None)
@given(pair=matrix_pairs())
def test_agrees_with_matmul_operator(matmul, pair):
    a, b = pair
    c = matmul(a, b)
    expected = a @ b
    assert type(c) is np.ndarray
    assert c.shape == expected.shape and c.dtype == expected.dtype
    np.testing.assert_allclose(c, expected, rtol=1e-9, atol=1e-6)

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float32, np.float64), (np.int64, np.int64)])
def test_result_dtype_matches_operator(matmul, dtypes):
    rng = np.random.default_rng(0)
    a = (rng.integers(-5, 5, (3, 4))).astype(dtypes[0])
    b = (rng.integers(-5, 5, (4, 2))).astype(dtypes[1])
    c = matmul(a, b)
    assert c.dtype == (a @ b).dtype
    np.testing.assert_array_equal(c, a @ b)   # small integers: exact in every dtype

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
def test_known_product(matmul):
    a, b = np.array([[1., 2.], [3., 4.]]), np.array([[5., 6.], [7., 8.]])
    np.testing.assert_array_equal(matmul(a, b), [[19., 22.], [43., 50.]])

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
def test_inputs_are_not_modified(matmul):
    a, b = np.arange(6.).reshape(2, 3), np.arange(12.).reshape(3, 4)
    a0, b0 = a.copy(), b.copy()
    matmul(a, b)
    np.testing.assert_array_equal(a, a0); np.testing.assert_array_equal(b, b0)

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
@given(n=st.integers(1, 5), k=st.integers(1, 5), k2=st.integers(1, 5), m=st.integers(1, 5))
@settings(max_examples=30, deadline=None)
def test_inner_dimension_mismatch(matmul, n, k, k2, m):
    a, b = np.ones((n, k)), np.ones((k2, m))
    if k == k2:
        assert matmul(a, b).shape == (n, m)
        return
    with pytest.raises(ShapeError) as info:
        matmul(a, b)
    assert str(info.value) == (f"{matmul.__name__}: cannot multiply a ({n}, {k}) by b ({k2}, {m}): "
                               "inner dimensions differ")

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
@pytest.mark.parametrize("a_shape,b_shape,bad,got", [
    ((3,), (3, 2), "a", "shape (3,)"),
    ((2, 3), (3,), "b", "shape (3,)"),
    ((1, 2, 3), (3, 2), "a", "shape (1, 2, 3)"),
    ((), (3, 2), "a", "shape ()"),
])
def test_wrong_number_of_axes(matmul, a_shape, b_shape, bad, got):
    with pytest.raises(ShapeError, match=rf"^{matmul.__name__}: {bad} must be a 2-d array, got {re_escape(got)}$"):
        matmul(np.ones(a_shape), np.ones(b_shape))

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
def test_not_an_array(matmul):
    with pytest.raises(ShapeError, match=f"{matmul.__name__}: a must be a 2-d array, got a list"):
        matmul([[1.0, 2.0]], np.ones((2, 2)))

def test_shape_error_is_a_fastad_value_error():
    with pytest.raises(FastADError): check_matmul("op", np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError): check_matmul("op", np.ones((2, 3)), np.ones((2, 3)))
    assert check_matmul("op", np.ones((2, 3)), np.ones((3, 4))) == (2, 3, 4)

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
@settings(max_examples=25, deadline=None)
@given(pair=matrix_pairs(max_side=4))
def test_strict_backend_in_strict_arrays_out(matmul, pair):
    a, b = pair
    with use_backend("strict"):
        sa, sb = to_device(a), to_device(b)
        assert type(sa) is strict.StrictArray
        c = matmul(sa, sb)
    assert type(c) is strict.StrictArray
    assert c.shape == (a.shape[0], b.shape[1]) and c.dtype == np.float64
    np.testing.assert_allclose(to_host(c), a @ b, rtol=1e-9, atol=1e-6)

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
def test_strict_float32_from_the_backend(matmul):
    with use_backend("strict"):
        a, b = random_normal((3, 5), rng=default_rng(0)), random_normal((5, 4), rng=default_rng(1))
        assert xp() is strict and type(a) is strict.StrictArray
        c = matmul(a, b)
        assert type(c) is strict.StrictArray and c.dtype == np.float32
        np.testing.assert_allclose(to_host(c), to_host(a @ b), rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
def test_strict_shape_error(matmul):
    with use_backend("strict"):
        a, b = xp().ones((2, 3)), xp().ones((4, 5))
        with pytest.raises(ShapeError, match=rf"{matmul.__name__}: cannot multiply a \(2, 3\) by b \(4, 5\)"):
            matmul(a, b)

@pytest.mark.parametrize("matmul", MATMULS, ids=ids)
@pytest.mark.parametrize("host_first", [True, False])
def test_mixing_host_and_strict_arrays_is_refused(matmul, host_first):
    host, dev = np.ones((2, 3)), strict.ones((3, 2))
    a, b = (host, dev) if host_first else (dev.T, host.T)
    with pytest.raises(HostTransferError, match=f"{matmul.__name__}: a is a .* array but b is a .* array"):
        matmul(a, b)

def re_escape(s):
    import re
    return re.escape(s)
