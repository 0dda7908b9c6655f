"""The strict backend behaves like a device array module: NumPy's results, no implicit host copies."""
import numpy as np, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
import fastad.strict as strict
from fastad.strict import StrictArray
from fastad.errors import HostTransferError

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
UNARY = [np.sin, np.cos, np.exp, np.tanh, np.abs, np.negative, np.square, np.sign, np.floor]
BINARY = [np.add, np.subtract, np.multiply, np.maximum, np.minimum, np.greater, np.equal]
REDUCTIONS = [np.sum, np.mean, np.max, np.min, np.prod, np.std]

def same(s, a):
    assert type(s) is StrictArray, type(s)
    np.testing.assert_allclose(s.get(), a, rtol=1e-12)

@given(shapes, st.integers(0, 2**31), st.sampled_from(UNARY))
@settings(max_examples=40, deadline=None)
def test_unary_ufuncs_match_numpy(shape, seed, f):
    a = np.random.default_rng(seed).standard_normal(shape)
    same(f(strict.asarray(a)), f(a))

@given(shapes, st.integers(0, 2**31), st.sampled_from(BINARY))
@settings(max_examples=40, deadline=None)
def test_binary_ufuncs_and_broadcasting(shape, seed, f):
    r = np.random.default_rng(seed)
    a, b = r.standard_normal(shape), r.standard_normal(shape[-1:] if shape else ())
    same(f(strict.asarray(a), strict.asarray(b)), f(a, b))
    same(f(strict.asarray(a), 2.5), f(a, 2.5))               # Python scalars are fine
    same(f(np.float32(2), strict.asarray(a)), f(np.float32(2), a))

@given(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.integers(0, 2**31), st.sampled_from(REDUCTIONS))
@settings(max_examples=40, deadline=None)
def test_reductions(shape, seed, f):
    a = np.random.default_rng(seed).standard_normal(shape)
    same(f(strict.asarray(a)), f(a))                          # a 0-d StrictArray, as CuPy returns
    same(f(strict.asarray(a), axis=-1), f(a, axis=-1))
    same(getattr(strict.asarray(a), f.__name__)(axis=0), f(a, axis=0))   # the method form: s.sum(axis=0), ...

def test_methods_indexing_and_ufunc_methods():
    a = np.arange(24.).reshape(2, 3, 4); s = strict.asarray(a)
    same(s.T, a.T); same(s.reshape(6, 4), a.reshape(6, 4)); same(s.transpose(2, 0, 1), a.transpose(2, 0, 1))
    same(s[1, :, ::2], a[1, :, ::2]); same(s[s > 10], a[a > 10]); same(s[strict.asarray([0, 0])], a[[0, 0]])
    same(np.add.reduce(s, axis=2), np.add.reduce(a, axis=2)); same(np.multiply.outer(s[0, 0], s[1, 1]), np.multiply.outer(a[0, 0], a[1, 1]))
    same(s @ s.swapaxes(1, 2), a @ a.swapaxes(1, 2)); same(np.concatenate([s, s], 1), np.concatenate([a, a], 1))
    same(np.where(s > 5, s, 0.), np.where(a > 5, a, 0.)); same(strict.einsum('ijk->k', s), np.einsum('ijk->k', a))
    t = strict.zeros(3); strict.add.at(t, strict.asarray([0, 2, 2]), 1.); same(t, [1., 0, 2])   # as cupy.add.at
    with pytest.raises(TypeError): np.add.at(t, [0], 1.)                # NumPy's own is refused, as CuPy's arrays refuse it
    t[1] = 5.; same(t, [1., 5, 2])
    assert [r.shape for r in s] == [(3, 4), (3, 4)] and len(s) == 2 and s.dtype == np.float64

@pytest.mark.parametrize("convert", [np.asarray, np.array, lambda s: float(s), lambda s: s + np.ones(3),
                                     lambda s: np.concatenate([s, np.ones(3)]), lambda s: np.add(s, np.ones(3)),
                                     lambda s: s.__setitem__(0, np.ones(1))])
def test_implicit_host_transfers_are_refused(convert):
    with pytest.raises(HostTransferError): convert(strict.arange(3.))

def test_explicit_transfers_are_allowed():
    s = strict.arange(3.)
    assert s.get().tolist() == [0., 1., 2.] and strict.asnumpy(s).tolist() == [0., 1., 2.]
    assert float(s[2]) == 2.0 and s[1].item() == 1.0 and s.tolist() == [0., 1., 2.]

def test_foreign_protocols_get_their_turn():
    class Recorder:
        calls = []
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs): self.calls.append(ufunc.__name__); return 'r'
        def __array_function__(self, func, types, args, kwargs): self.calls.append(func.__name__); return 'f'
    r = Recorder()
    assert strict.ones(2) * r == 'r' and np.maximum(strict.ones(2), r) == 'r'
    assert np.concatenate([strict.ones(2), r]) == 'f' and Recorder.calls == ['multiply', 'maximum', 'concatenate']

def test_random_generator_and_module_functions():
    g = strict.random.default_rng(0)
    assert all(type(x) is StrictArray for x in (g.standard_normal((2, 2)), g.uniform(size=3), g.integers(0, 5, 4)))
    assert strict.get_array_module(strict.ones(1)) is strict and strict.get_array_module(np.ones(1)) is np
    assert type(strict.linspace(0, 1, 5)) is StrictArray and type(strict.zeros_like(strict.ones(2))) is StrictArray


def test_strict_copies_cupys_refusals_of_repeated_writes_and_python_number_conditions():
    "As CuPy: repeated places written with several values are refused (CuPy keeps any one), and a Python number as where's condition."
    from fastad import strict
    from fastad.errors import BackendError
    a = strict.zeros((3, 2))
    for condition in (True, 1, 0.5):
        with pytest.raises(BackendError, match="as the condition, which CuPy's where refuses"): strict.where(condition, a, 0)
        with pytest.raises(BackendError, match="as the condition"): np.where(condition, a, 0)
    np.testing.assert_array_equal(strict.where(np.True_, a, 1).get(), np.zeros((3, 2)))
    rows = strict.asarray(np.array([2, -1]))                                 # -1 is row 2 again
    with pytest.raises(BackendError, match="names one place more than once"): a[rows] = strict.asarray(np.ones((2, 2)))
    with pytest.raises(BackendError, match="add.at"): a[rows, 0] = strict.asarray(np.array([1., 2.]))
    a[rows] = 1.0; a[rows] = strict.asarray(np.ones(1))                     # one value, written twice: fine
    a[strict.asarray(np.array([0, 1])), 1] = strict.asarray(np.array([5., 6.]))
    a[..., strict.asarray(np.array([0]))] = strict.asarray(np.array([[7.], [8.], [9.]]))
    np.testing.assert_array_equal(a.get(), [[7., 5.], [8., 6.], [9., 1.]])
