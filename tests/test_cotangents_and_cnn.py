"""Cotangents a custom pullback may trust (private, of the result's dtype, never an np.matrix), what a custom
pullback keeps alive, second order through the CNN layers, and empty batches (issues 17 and 24)."""
import gc, tracemalloc
import numpy as np, pytest
import fastad as fd
from fastad.cnn import conv2d, max_pool2d
from fastad.errors import DifferentiationError

pytestmark = pytest.mark.filterwarnings('ignore::PendingDeprecationWarning')   # np.matrix, on purpose

# --- 17.2: cotangents are not shared mutable state -------------------------------------------------------------

def _tripled_in_place():
    def vjp(x):
        def pb(g):
            g *= 3                                      # writes into the cotangent it was given
            return g
        return x, pb
    return fd.differentiable_function(vjp, name='tripled')

def _tripled():
    return fd.differentiable_function(lambda x: (x, lambda g: g * 3), name='tripled')

def test_a_pullback_writing_its_cotangent_cannot_change_a_sibling_branch():
    x, v = np.array([0.5, 1.0]), np.ones(2)
    f = lambda x: _tripled_in_place()(np.sin(x)) + np.sin(x) + 3
    with pytest.raises(DifferentiationError, match=r"tripled: .*read-only.*copy it first"):
        fd.pullback(f, x)(v)                            # before: 3 cos x + 3 cos x, silently (the sibling saw g * 3)
    test = fd.pullback(lambda x: _tripled()(np.sin(x)) + np.sin(x) + 3, x)(v)
    np.testing.assert_allclose(test, 4 * np.cos(x))     # 3 cos x from the custom branch, cos x from the sibling

def test_a_pullback_writing_its_cotangent_leaves_the_callers_array_alone():
    x, v = np.array([0.5, 1.0]), np.ones(2)
    with pytest.raises(DifferentiationError, match="read-only"):
        fd.pullback(lambda x: _tripled_in_place()(x), x)(v)     # before: returned [3, 3] and v became [3, 3]
    np.testing.assert_array_equal(v, [1, 1])

def test_a_pullback_writing_a_broadcast_cotangent_gets_a_fastad_error_not_numpys():
    x = np.array([0.5, 1.0])
    with pytest.raises(DifferentiationError, match="g = g.copy()"):    # before: NumPy's ValueError, output array is read-only
        fd.gradient(lambda x: (_tripled_in_place()(x.sum(0, keepdims=True) * np.ones(3))).sum(), x)

def test_a_custom_pullbacks_cotangent_is_read_only_but_the_caller_keeps_a_writable_array():
    seen = []
    f = fd.differentiable_function(lambda x: (x * 2, lambda g: (seen.append(g), g * 2)[1]), name='double')
    v = np.ones(3)
    np.testing.assert_array_equal(fd.pullback(f, np.zeros(3))(v), [2, 2, 2])
    assert not seen[-1].flags.writeable and v.flags.writeable

# --- 17.8: cotangent types -------------------------------------------------------------------------------------

def test_a_python_float_cotangent_for_a_float64_scalar_result_is_cast():
    A = np.array([[2., 1.], [1., 3.]])
    np.testing.assert_allclose(fd.value_with_pullback(np.linalg.det, A)[1](1.0), [[3, -1], [-1, 2]])  # before: TypeError

@pytest.mark.parametrize("x, cotangent, dtype", [
    (np.float64(1.0), 1.0, np.float64), (1.0, 1.0, np.float64), (np.ones(2, np.float32), np.ones(2), np.float32),
    (np.float32(1.0), 1.0, np.float32), (np.ones((), np.float32), np.float64(1.0), np.float32)])
def test_a_custom_pullback_receives_a_numpy_value_of_the_results_dtype(x, cotangent, dtype):
    seen = []
    double = fd.differentiable_function(lambda x: (x * 2, lambda g: (seen.append(g), g * 2)[1]), name='double')
    fd.pullback(lambda x: double(x), x)(cotangent)
    assert isinstance(seen[-1], (np.ndarray, np.generic)) and seen[-1].dtype == dtype, (type(seen[-1]), seen[-1])

# --- 24.5: np.matrix cotangents and inputs ----------------------------------------------------------------------

def test_an_np_matrix_cotangent_is_an_array_at_the_door():
    x = np.array([[1., 2.], [3., 4.]])
    got = fd.pullback(lambda x: x * x, x)(np.matrix(np.ones((2, 2))))
    assert type(got) is np.ndarray
    np.testing.assert_allclose(got, 2 * x)              # before: [[8, 12], [8, 12]], matrix products
    got = fd.pullback(lambda x: np.sin(x) * x, x)(np.matrix(np.ones((2, 2))))
    np.testing.assert_allclose(got, np.cos(x) * x + np.sin(x))

def test_an_np_matrix_from_a_custom_pullback_becomes_an_array():
    seen = []
    colsum = fd.differentiable_function(                 # SciPy's sparse reductions hand back an np.matrix
        lambda x: (x * 1, lambda g: (seen.append(type(g)), np.matrix(g))[1]), name='as_matrix')
    x = np.array([[1., 2.], [3., 4.]])
    got = fd.gradient(lambda x: colsum(x * x).sum(), x)  # the matrix meets x * x's chain: g * x
    assert type(got) is np.ndarray and seen == [np.ndarray]
    np.testing.assert_allclose(got, 2 * x)              # before: [[8, 12], [8, 12]], a matrix product

def test_an_np_matrix_input_is_a_fastad_error():
    with pytest.raises(DifferentiationError, match=r"argument 0 is a numpy.matrix.*numpy.asarray"):   # before: keepdims TypeError
        fd.gradient(lambda x: (x * x).sum(), np.matrix([[1., 2.], [3., 4.]]))

# --- 24.2: what a pullback keeps alive ----------------------------------------------------------------------------

N = 1_000_000                                            # 8 MB of float64

def _held(make):
    "Bytes the pullback `make()` returns keeps alive, measured with tracemalloc, and the same after calling it once."
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        pb = make()
        built = tracemalloc.get_traced_memory()[0] - start
        pb(1.0)
        gc.collect()
        called = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    return built, called

def test_a_custom_functions_pullback_does_not_keep_its_output():
    x = np.ones(N)
    double = fd.differentiable_function(lambda x: (x * 2, lambda g: g * 2), name='double')
    plain, _ = _held(lambda: fd.pullback(lambda x: (x * 2).sum(), x))
    custom, _ = _held(lambda: fd.pullback(lambda x: double(x).sum(), x))
    assert plain < 64_000                                # about 2 KB
    assert custom < plain + 64_000, (plain, custom)      # before: 8 MB more, the custom function's own output

def test_a_registered_derivatives_pullback_does_not_keep_its_output():
    def doubled(x): return x * 2
    x = np.ones(N)
    with fd.derivative(of=doubled, vjp=lambda x: (x * 2, lambda g: g * 2)):
        custom, _ = _held(lambda: fd.pullback(lambda x: doubled(x).sum(), x))
    plain, _ = _held(lambda: fd.pullback(lambda x: (x * 2).sum(), x))
    assert custom < plain + 64_000, (plain, custom)

def test_a_called_pullback_does_not_keep_a_constants_cotangent():
    x, c = np.ones(N), np.full(N, 2.0)
    times = fd.differentiable_function(lambda x, c: (x * c, lambda g: (g * c, g * x)), name='times')
    _, plain = _held(lambda: fd.pullback(lambda x: (x * c).sum(), x))
    _, custom = _held(lambda: fd.pullback(lambda x: times(x, c).sum(), x))
    assert custom < plain + 64_000, (plain, custom)      # before: 8 MB more, c's cotangent in a per-thread cache

def test_a_custom_function_still_gives_every_traced_input_its_cotangent():
    times = fd.differentiable_function(lambda x, c: (x * c, lambda g: (g * c, g * x)), name='times')
    x, c = np.array([1., 2.]), np.array([3., 4.])
    gx, gc_ = fd.gradient(lambda x, c: times(x, c).sum(), x, c)
    np.testing.assert_array_equal(gx, c); np.testing.assert_array_equal(gc_, x)
    pb = fd.pullback(lambda x: times(x, c).sum(), x)
    for _ in range(2): np.testing.assert_array_equal(pb(1.0), c)     # called again: the pullback runs again

# --- 17.10: second order through the CNN --------------------------------------------------------------------------

def _slope(f, args, i, d, eps=1e-6):
    "Central differences of scalar `f` along `d` in argument `i`."
    def at(t): return float(f(*args[:i], args[i] + t * d, *args[i + 1:]))
    return (at(eps) - at(-eps)) / (2 * eps)

def _check_gradient(f, *args, rtol=1e-5):
    r = np.random.default_rng(1)
    grads = fd.gradient(f, *args)
    grads = grads if len(args) > 1 else (grads,)
    for i, g in enumerate(grads):
        d = r.standard_normal(np.shape(args[i]))
        np.testing.assert_allclose(np.sum(g * d), _slope(f, args, i, d), rtol=rtol, atol=1e-7)

@pytest.mark.parametrize("strides, padding", [((1, 1), 'valid'), ((2, 1), 'same'), ((2, 2), 'same')])
def test_a_conv2d_gradient_penalty_differentiates(strides, padding):
    r = np.random.default_rng(0)
    x, W, b = r.standard_normal((2, 6, 5, 2)), r.standard_normal((3, 2, 2, 3)), r.standard_normal(3)
    def penalty(x, W, b):                                # the squared norm of the input's gradient
        gx = fd.gradient(lambda x: np.tanh(conv2d(x, W, b, strides=strides, padding=padding)).sum(), x)
        return (gx ** 2).sum()
    _check_gradient(penalty, x, W, b)                    # before: "ndarray.strides has no derivative"

def test_conv2d_in_a_hessian_matches_finite_differences():
    r = np.random.default_rng(2)
    x, W = r.standard_normal((1, 5, 5, 2)), r.standard_normal((3, 3, 2, 2))
    f = lambda W: (np.sin(conv2d(x, W, padding='same')) * conv2d(x ** 2, W)[:, :1, :1].sum()).sum()
    _check_gradient(lambda W: (fd.gradient(f, W) * W).sum(), W)

@pytest.mark.parametrize("pool, strides, padding", [((2, 2), (2, 2), 'valid'), ((3, 2), (1, 2), 'same')])
def test_max_pool2d_at_second_order(pool, strides, padding):
    x = np.random.default_rng(3).standard_normal((2, 5, 6, 2))        # no ties: winners stay put near x
    f = lambda x: (max_pool2d(x, pool_size=pool, strides=strides, padding=padding) ** 3).sum()
    _check_gradient(lambda x: (fd.gradient(f, x) ** 2).sum(), x)      # before: "in-place updates ... not differentiable"

def test_a_cnn_layers_gradient_penalty_differentiates():
    r = np.random.default_rng(4)
    x, filter, bias = r.standard_normal((2, 4, 4, 1)), r.standard_normal((3, 3, 1, 2)), r.standard_normal(2)
    pool, flatten = fd.MaxPool2D(), fd.Flatten()
    def penalty(filter, bias):                           # the layers' model, differentiated in its input, then in its filter
        conv = fd.Conv2D(filter=filter, bias=bias, padding='same', activation=np.tanh)
        return (fd.gradient(lambda x: (flatten(pool(conv(x))) ** 2).sum(), x) ** 2).sum()
    _check_gradient(penalty, filter, bias)
    g = fd.gradient(lambda conv: (fd.gradient(lambda x: (flatten(pool(conv(x))) ** 2).sum(), x) ** 2).sum(),
                    fd.Conv2D(filter=filter, bias=bias, padding='same', activation=np.tanh))
    np.testing.assert_allclose(g.filter, fd.gradient(penalty, filter, bias)[0])

# --- 24.7: empty batches -------------------------------------------------------------------------------------------

def test_flatten_takes_an_empty_batch():
    x = np.zeros((0, 2, 2))
    assert fd.Flatten()(x).shape == (0, 4)               # before: NumPy's "cannot reshape array of size 0"
    y, pb = fd.value_with_pullback(lambda x: fd.Flatten()(x), x)
    assert y.shape == (0, 4) and pb(np.zeros((0, 4))).shape == (0, 2, 2)

def test_an_empty_batch_through_a_cnn():
    layers = [fd.Conv2D((3, 3, 1, 2), padding='same', rng=np.random.default_rng(0)), fd.MaxPool2D(), fd.Flatten()]
    x = np.zeros((0, 4, 4, 1), np.float32)
    y, pb = fd.value_with_pullback(lambda layers, x: fd.sequenced(x, through=layers), layers, x)
    assert y.shape == (0, 8)
    d_layers, d_x = pb(np.zeros((0, 8), np.float32))
    assert d_x.shape == (0, 4, 4, 1) and d_layers[0].filter.shape == (3, 3, 1, 2)

def test_max_pool_sends_an_infinite_cotangent_to_the_winner_only():
    "Masks select, never multiply: the losers of a window get 0, not 0 * inf = nan."
    from fastad.cnn import max_pool2d
    x = np.arange(16.).reshape(1, 4, 4, 1)
    with np.errstate(divide='ignore'):
        g = fd.gradient(lambda x: (1 / (max_pool2d(x) - np.array([5., 7., 13., 15.]).reshape(1, 2, 2, 1))).sum(), x)
    assert not np.isnan(g).any()
    assert np.isinf(g[0, 1::2, 1::2, 0]).all() and (g[0, 0::2] == 0).all() and (g[0, :, 0::2] == 0).all()
