"""The CNN layers of lesson 06 (nbs/06_cnn_layers.ipynb) against independent references and float64 central differences.

Forward passes are compared with naive loops written here (with their own 'same'-padding rule); every gradient,
of inputs and of layer fields, is compared with central differences along random directions, for strides and
both paddings, on every backend (`any_backend`: numpy, strict, and cupy where a GPU is available).
Also second order through the layers, and empty batches.
"""
import dataclasses, inspect, math
import numpy as np, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
import fastad as fd
from fastad.backend import to_device, to_host, array_module, manual_seed, random_normal, default_rng
from fastad.cnn import conv2d_vwc, max_pool2d_vwc, windows
from fastad.strict import StrictArray
from fastad.cnn import conv2d, max_pool2d

fast = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------- references, written independently

def same_padding(size, window, stride):
    "TensorFlow's 'same': ceil(size / stride) outputs; the padding they need, the extra pixel at the end."
    out = math.ceil(size / stride)
    need = max(0, (out - 1) * stride + window - size)
    return need // 2, need - need // 2

def padded(x, window, strides, padding, value=0.0):
    if padding == 'valid': return x
    (t, b), (l, r) = (same_padding(x.shape[1], window[0], strides[0]), same_padding(x.shape[2], window[1], strides[1]))
    out = np.full((x.shape[0], x.shape[1] + t + b, x.shape[2] + l + r, x.shape[3]), value)
    out[:, t:t + x.shape[1], l:l + x.shape[2]] = x
    return out

def naive_conv(x, f, strides, padding):
    "Every output value as a sum of products, one at a time."
    kh, kw, c, o = f.shape
    xp = padded(x, (kh, kw), strides, padding)
    oh, ow = (xp.shape[1] - kh) // strides[0] + 1, (xp.shape[2] - kw) // strides[1] + 1
    y = np.zeros((x.shape[0], oh, ow, o))
    for n in range(x.shape[0]):
        for i in range(oh):
            for j in range(ow):
                for k in range(o):
                    y[n, i, j, k] = sum(xp[n, i * strides[0] + a, j * strides[1] + b, ch] * f[a, b, ch, k]
                                        for a in range(kh) for b in range(kw) for ch in range(c))
    return y

def naive_pool(x, size, strides, padding):
    xp = padded(x, size, strides, padding, value=-np.inf)
    oh, ow = (xp.shape[1] - size[0]) // strides[0] + 1, (xp.shape[2] - size[1]) // strides[1] + 1
    y = np.zeros((x.shape[0], oh, ow, x.shape[3]))
    for i in range(oh):
        for j in range(ow):
            y[:, i, j] = xp[:, i * strides[0]:i * strides[0] + size[0], j * strides[1]:j * strides[1] + size[1]].max(axis=(1, 2))
    return y

def naive_cross_entropy(logits, labels):
    return float(np.mean([-(z[y] - np.log(np.sum(np.exp(z)))) for z, y in zip(logits, labels)]))

def check_gradients(f, *xs, eps=1e-6, tol=1e-6, seed=0):
    """Assert that the pullback of `f` at `xs` (arrays or models, float64) matches central differences of
    <v, f> along a random direction of every leaf at once, and keeps structure, dtype and device."""
    rng = np.random.default_rng(seed)
    y, pb = fd.value_with_pullback(f, *xs)
    v = to_device(rng.standard_normal(np.shape(to_host(y))))
    grads = pb(v)
    grads = grads if len(xs) > 1 else (grads,)
    for i, (x, g) in enumerate(zip(xs, grads)):
        leaves, rebuild = fd.tree.flatten(x, static_ok=True)
        g_leaves, _ = fd.tree.flatten(g, static_ok=True)
        assert type(g) is type(x) and len(g_leaves) == len(leaves), (i, type(g))
        for a, b in zip(leaves, g_leaves):
            assert b.shape == a.shape and b.dtype == a.dtype and type(b) is type(a), (i, b.shape, a.shape, type(b))
        ds = [to_device(rng.standard_normal(a.shape)) for a in leaves]
        def along(t):
            moved = rebuild([a + t * d for a, d in zip(leaves, ds)])
            return float(to_host(np.sum(v * f(*xs[:i], moved, *xs[i + 1:]))))
        numeric = (along(eps) - along(-eps)) / (2 * eps)
        analytic = sum(float(to_host(np.sum(b * d))) for b, d in zip(g_leaves, ds))
        assert abs(analytic - numeric) <= tol * max(1.0, abs(numeric)), (i, analytic, numeric)

def rand(seed, *shape): return np.random.default_rng(seed).standard_normal(shape)

# ---------------------------------------------------------------- convolution

conv_cases = st.fixed_dictionaries(dict(
    n=st.integers(1, 2), h=st.integers(1, 7), w=st.integers(1, 7), c=st.integers(1, 3), o=st.integers(1, 3),
    kh=st.integers(1, 4), kw=st.integers(1, 4), strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    padding=st.sampled_from(['valid', 'same']), seed=st.integers(0, 2**31)))

def fits(case): return case['padding'] == 'same' or (case['h'] >= case['kh'] and case['w'] >= case['kw'])

@given(case=conv_cases)
@fast
def test_conv2d_matches_a_naive_loop(any_backend, case):
    x, f = rand(case['seed'], case['n'], case['h'], case['w'], case['c']), rand(case['seed'] + 1, case['kh'], case['kw'], case['c'], case['o'])
    run = lambda: fd.conv2d(to_device(x), to_device(f), strides=case['strides'], padding=case['padding'])
    if not fits(case):
        with pytest.raises(fd.ShapeError, match="each window must fit"): run()
        return
    y = run()
    assert array_module(y) is any_backend or (any_backend.__name__ == 'numpy' and array_module(y) is np)
    np.testing.assert_allclose(to_host(y), naive_conv(x, f, case['strides'], case['padding']), rtol=1e-10, atol=1e-10)

@given(case=conv_cases)
@fast
def test_conv2d_gradients_match_central_differences(any_backend, case):
    if not fits(case): return
    x, f = rand(case['seed'], case['n'], case['h'], case['w'], case['c']), rand(case['seed'] + 1, case['kh'], case['kw'], case['c'], case['o'])
    check_gradients(lambda x, f: fd.conv2d(x, f, strides=case['strides'], padding=case['padding']), to_device(x), to_device(f))

def test_conv2d_tensorflow_same_padding_puts_the_odd_pixel_after(any_backend):
    # 1x4 image, 1x2 filter of ones, stride 1, 'same': one zero goes after, so the last output is x[3] alone
    x = to_device(np.array([1., 2., 3., 4.]).reshape(1, 1, 4, 1))
    y = fd.conv2d(x, to_device(np.ones((1, 2, 1, 1))), padding='same')
    np.testing.assert_array_equal(to_host(y).ravel(), [3., 5., 7., 4.])

def test_conv2d_accepts_non_contiguous_input(any_backend):
    x, f = rand(0, 2, 10, 8, 3), rand(1, 3, 3, 3, 2)
    y = fd.conv2d(to_device(x)[:, ::2], to_device(f), strides=(1, 2))
    np.testing.assert_allclose(to_host(y), naive_conv(x[:, ::2], f, (1, 2), 'valid'), rtol=1e-10)

def test_conv2d_float32_in_float32_out(any_backend):
    x, f = to_device(rand(0, 2, 6, 6, 3).astype(np.float32)), to_device(rand(1, 3, 3, 3, 4).astype(np.float32))
    y, (gx, gf) = fd.value_with_gradient(lambda x, f: fd.conv2d(x, f, strides=2, padding='same').sum(), x, f)
    assert (y.dtype, gx.dtype, gf.dtype) == (np.float32,) * 3

def test_conv2d_pullbacks_keep_only_the_input_and_the_filter():
    x, f = rand(0, 2, 8, 8, 3), rand(1, 5, 5, 3, 4)
    _, chains = conv2d_vwc(x, f, strides=(2, 1), padding='same')
    saved = {}
    for chain in chains: saved.update(inspect.getclosurevars(chain).nonlocals)
    arrays = {name: v for name, v in saved.items() if hasattr(v, 'shape')}
    assert set(arrays) == {'x', 'filter'} and arrays['x'] is x and arrays['filter'] is f

@given(case=conv_cases)
@fast
def test_conv2d_with_a_bias_is_the_sum_and_its_gradients_match_central_differences(any_backend, case):
    if not fits(case): return
    x, f, b = rand(case['seed'], case['n'], case['h'], case['w'], case['c']), \
        rand(case['seed'] + 1, case['kh'], case['kw'], case['c'], case['o']), rand(case['seed'] + 2, case['o'])
    conv = lambda x, f, b: fd.conv2d(x, f, b, strides=case['strides'], padding=case['padding'])
    np.testing.assert_allclose(to_host(conv(to_device(x), to_device(f), to_device(b))),
                               naive_conv(x, f, case['strides'], case['padding']) + b, rtol=1e-10, atol=1e-12)
    check_gradients(conv, to_device(x), to_device(f), to_device(b))

def test_conv2d_refuses_a_bias_that_is_not_one_per_output_channel():
    with pytest.raises(fd.ShapeError, match=r"conv2d: bias must have shape \(4,\), one per output channel"):
        fd.conv2d(np.ones((1, 5, 5, 2)), np.ones((3, 3, 2, 4)), np.ones(2))

def test_the_conv2d_layer_adds_its_bias_inside_one_primitive():
    layer = fd.Conv2D(filter=rand(0, 3, 3, 2, 4), bias=rand(1, 4), activation=None)
    with fd.trace_primitives() as log: fd.gradient(lambda m: m(rand(2, 1, 5, 5, 2)).sum(), layer)
    assert log.count('forward', 'conv2d') == 1 and log.count('forward', 'add') == 0, log

def test_windows_is_a_view():
    x = np.arange(2 * 5 * 6 * 3.).reshape(2, 5, 6, 3)
    w = windows(x, (3, 2), (2, 2))
    assert w.shape == (2, 2, 3, 3, 3, 2) and np.shares_memory(w, x)
    np.testing.assert_array_equal(w[1, 1, 2, :, :, :], x[1, 2:5, 4:6, :].transpose(2, 0, 1))

# ---------------------------------------------------------------- max pooling

pool_cases = st.fixed_dictionaries(dict(
    n=st.integers(1, 2), h=st.integers(1, 7), w=st.integers(1, 7), c=st.integers(1, 3),
    size=st.tuples(st.integers(1, 3), st.integers(1, 3)), strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    padding=st.sampled_from(['valid', 'same']), seed=st.integers(0, 2**31)))

def pool_fits(case): return case['padding'] == 'same' or (case['h'] >= case['size'][0] and case['w'] >= case['size'][1])

@given(case=pool_cases)
@fast
def test_max_pool2d_matches_a_naive_loop_and_central_differences(any_backend, case):
    x = rand(case['seed'], case['n'], case['h'], case['w'], case['c'])
    pool = lambda x: fd.max_pool2d(x, pool_size=case['size'], strides=case['strides'], padding=case['padding'])
    if not pool_fits(case):
        with pytest.raises(fd.ShapeError, match="each window must fit"): pool(to_device(x))
        return
    np.testing.assert_array_equal(to_host(pool(to_device(x))), naive_pool(x, case['size'], case['strides'], case['padding']))
    check_gradients(pool, to_device(x))

def test_max_pool2d_overlapping_windows_add_up(any_backend):
    # 1x1x3 image, windows of 2 with stride 1: the middle pixel wins both windows and gets both cotangents
    x = to_device(np.array([0., 5., 1.]).reshape(1, 1, 3, 1))
    g = fd.pullback(lambda x: fd.max_pool2d(x, pool_size=(1, 2), strides=(1, 1)), x)(to_device(np.array([2., 3.]).reshape(1, 1, 2, 1)))
    np.testing.assert_array_equal(to_host(g).ravel(), [0., 5., 0.])

def test_max_pool2d_a_tie_goes_to_the_first_pixel_of_its_window_in_row_order():
    # one 2x2 window per case, the maximum 1 at two or more places; the cotangent goes to the first in row order
    for ones in [((0, 1), (1, 0)), ((1, 0), (1, 1)), ((0, 0), (1, 1)), ((0, 1), (1, 0), (1, 1))]:   # in row order
        x = np.zeros((1, 2, 2, 1))
        for i, j in ones: x[0, i, j, 0] = 1.0
        g = fd.gradient(lambda x: fd.max_pool2d(x).sum(), to_device(x))
        want = np.zeros((1, 2, 2, 1)); want[0, ones[0][0], ones[0][1], 0] = 1.0
        np.testing.assert_array_equal(to_host(g), want, err_msg=str(ones))

def test_max_pool2d_windows_that_overlap_and_leave_gaps_route_every_cotangent():
    x = rand(3, 2, 7, 8, 3)
    for size, strides in [((3, 2), (1, 1)), ((2, 2), (3, 3)), ((3, 3), (2, 1))]:
        pool = lambda x: fd.max_pool2d(x, pool_size=size, strides=strides)
        g = to_host(fd.gradient(lambda x: (pool(x) * 2.0).sum(), to_device(x)))
        assert g.sum() == pytest.approx(2.0 * np.prod(to_host(pool(to_device(x))).shape))    # every output's cotangent, once
        check_gradients(pool, to_device(x))

def test_max_pool2d_saves_argmax_positions_not_masks():
    x = rand(0, 10, 12, 12, 6).astype(np.float32)
    _, chain = max_pool2d_vwc(x)
    arrays = {k: v for k, v in inspect.getclosurevars(chain).nonlocals.items() if hasattr(v, 'nbytes')}
    assert list(arrays) == ['winner'] and arrays['winner'].dtype == np.uint8
    assert arrays['winner'].shape == (10, 6, 6, 6)                   # one byte per output, not one per input

# ---------------------------------------------------------------- softmax cross entropy

@given(n=st.integers(1, 5), k=st.integers(1, 6), seed=st.integers(0, 2**31))
@fast
def test_softmax_cross_entropy_matches_a_naive_formula_and_central_differences(any_backend, n, k, seed):
    logits, labels = rand(seed, n, k), np.random.default_rng(seed).integers(0, k, n)
    loss = fd.softmax_cross_entropy(to_device(logits), to_device(labels))
    assert abs(float(to_host(loss)) - naive_cross_entropy(logits, labels)) < 1e-12
    check_gradients(lambda z: fd.softmax_cross_entropy(z, to_device(labels)), to_device(logits))

def test_softmax_cross_entropy_is_stable_and_keeps_float32(any_backend):
    logits = to_device(np.array([[1e4, 0., -1e4], [-1e4, 1e4, 3.]], np.float32))
    labels = to_device(np.array([1, 1]))
    loss, g = fd.value_with_gradient(lambda z: fd.softmax_cross_entropy(z, labels), logits)
    assert abs(float(to_host(loss)) - 5e3) < 1 and np.isfinite(to_host(g)).all()
    assert loss.dtype == np.float32 and g.dtype == np.float32
    np.testing.assert_allclose(to_host(g), [[0.5, -0.5, 0.], [0., 0., 0.]], atol=1e-6)

# ---------------------------------------------------------------- layers and applied_for_backpropagation

@pytest.mark.parametrize('strides,padding', [((1, 1), 'valid'), ((2, 1), 'same'), ((2, 3), 'valid'), ((3, 2), 'same')])
def test_conv2d_layer_gradients_of_fields_and_input(any_backend, strides, padding):
    layer = fd.Conv2D(filter=to_device(rand(0, 3, 2, 2, 3)), bias=to_device(rand(1, 3)), strides=strides,
                      padding=padding, activation=np.tanh)
    check_gradients(lambda layer, x: layer(x), layer, to_device(rand(2, 2, 7, 6, 2)))

@pytest.mark.parametrize('pool_size,strides,padding', [((2, 2), (2, 2), 'valid'), ((3, 2), (1, 2), 'same'), ((2, 3), (2, 1), 'valid')])
def test_max_pool_and_flatten_layers_gradients(any_backend, pool_size, strides, padding):
    model = fd.MaxPool2D(pool_size=pool_size, strides=strides, padding=padding)
    check_gradients(lambda x: fd.Flatten()(model(x)), to_device(rand(3, 2, 7, 6, 3)))

class CNN(fd.Layer):
    conv: fd.Conv2D
    pool: fd.MaxPool2D
    flatten: fd.Flatten
    dense: fd.Dense
    def forward(self, x): return fd.sequenced(x, through=[self.conv, self.pool, self.flatten, self.dense])

def tutorial_cnn(dtype=np.float64):
    rng = np.random.default_rng(0)
    def a(*shape): return to_device(rng.standard_normal(shape).astype(dtype) * 0.3)
    return CNN(fd.Conv2D(filter=a(5, 5, 3, 6), bias=a(6)), fd.MaxPool2D(), fd.Flatten(),
               fd.Dense(weight=a(216, 10), bias=a(10), activation=None))

def test_the_tutorial_cnn_whole_model_gradient(any_backend):
    model, x = tutorial_cnn(), to_device(rand(5, 2, 16, 16, 3))
    assert model(x).shape == (2, 10)
    check_gradients(lambda m, x: m(x), model, x)
    labels = to_device(np.array([3, 7]))
    check_gradients(lambda m: fd.softmax_cross_entropy(m(x), labels), model)

def test_applied_for_backpropagation_gives_model_and_input_cotangents(any_backend):
    model, x = tutorial_cnn(), to_device(rand(5, 2, 16, 16, 3))
    out, backprop = fd.applied_for_backpropagation(model, x)
    np.testing.assert_allclose(to_host(out), to_host(model(x)))
    labels = to_device(np.array([3, 7]))
    d_out = fd.gradient(lambda z: fd.softmax_cross_entropy(z, labels), out)
    d_model, d_x = backprop(d_out)
    g_model, g_x = fd.gradient(lambda m, x: fd.softmax_cross_entropy(m(x), labels), model, x)
    assert type(d_model) is CNN and type(d_model.conv) is fd.Conv2D and d_x.shape == x.shape
    for a, b in zip(fd.tree.flatten((d_model, d_x))[0], fd.tree.flatten((g_model, g_x))[0]):
        np.testing.assert_allclose(to_host(a), to_host(b), rtol=1e-12, atol=1e-14)
    d_model2, _ = backprop(d_out)                                   # callable again
    np.testing.assert_allclose(to_host(d_model2.conv.filter), to_host(d_model.conv.filter))

def test_a_training_step_lowers_the_loss(any_backend):
    manual_seed(0)
    model = CNN(fd.Conv2D((5, 5, 3, 6)), fd.MaxPool2D(), fd.Flatten(), fd.Dense(216, 10, activation=None))
    x, labels = random_normal((10, 16, 16, 3)), any_backend.arange(10)
    opt, losses = fd.SGD(model, learning_rate=0.01), []
    for _ in range(3):
        logits, backprop = fd.applied_for_backpropagation(model, x)
        loss, d_logits = fd.value_with_gradient(lambda z: fd.softmax_cross_entropy(z, labels), logits)
        opt.update(model, along=backprop(d_logits)[0])
        losses.append(float(to_host(loss)))
    assert losses[0] > losses[1] > losses[2], losses
    assert model.conv.filter.dtype == np.float32

def test_layers_rebuild_from_their_fields_by_keyword(any_backend):
    manual_seed(1)
    for layer in (fd.Conv2D((3, 3, 2, 4), strides=(2, 1), padding='same', activation=np.tanh),
                  fd.MaxPool2D(pool_size=(3, 3), strides=(1, 2), padding='same'), fd.Flatten()):
        again = type(layer)(**{f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)})
        for f in dataclasses.fields(layer): assert getattr(again, f.name) is getattr(layer, f.name) or \
            getattr(again, f.name) == getattr(layer, f.name), f.name

def test_conv2d_initialization_is_seeded_glorot_uniform_float32(any_backend):
    manual_seed(3); a = fd.Conv2D((5, 5, 3, 6))
    manual_seed(3); b = fd.Conv2D((5, 5, 3, 6))
    c = fd.Conv2D((5, 5, 3, 6), rng=default_rng(3))
    np.testing.assert_array_equal(to_host(a.filter), to_host(b.filter))
    assert not np.array_equal(to_host(a.filter), to_host(fd.Conv2D((5, 5, 3, 6)).filter))   # the stream moves on
    limit = math.sqrt(6 / (25 * 3 + 25 * 6))
    w = to_host(c.filter)
    assert w.dtype == np.float32 and np.abs(w).max() <= limit and np.abs(w).max() > 0.9 * limit
    assert abs(w.std() - limit / math.sqrt(3)) < 0.1 * limit                # a uniform's spread
    assert array_module(a.filter) is array_module(a.bias) and not to_host(a.bias).any()
    if any_backend.__name__.endswith('strict'): assert type(a.filter) is StrictArray

def test_conv2d_activation_and_strides_are_not_differentiated():
    layer = fd.Conv2D(filter=rand(0, 2, 2, 1, 1), bias=np.zeros(1), strides=2, activation=None)
    assert layer.strides == (2, 2) and layer.activation is None
    g = fd.gradient(lambda l: l(np.ones((1, 4, 4, 1))).sum(), layer)
    assert g.strides == (2, 2) and g.padding == 'valid'
    np.testing.assert_allclose(g.filter, np.full((2, 2, 1, 1), 4.))      # 4 outputs, each sees the filter once
    np.testing.assert_allclose(g.bias, [4.])

# ---------------------------------------------------------------- errors

ERRORS = [
    (lambda: fd.Conv2D((5, 5, 3, 6))(np.ones((16, 16, 3), np.float32)), fd.ShapeError, "Conv2D: the input must be 4-d (batch, height, width, channels), got shape (16, 16, 3)"),
    (lambda: fd.Conv2D((5, 5, 3, 6))(np.ones((1, 16, 16, 4), np.float32)), fd.ShapeError, "Conv2D: the input has 4 channels, but the filter (5, 5, 3, 6) expects 3"),
    (lambda: fd.Conv2D((5, 5, 3, 6))(np.ones((1, 4, 9, 3), np.float32)), fd.ShapeError, "input is 4 pixels across and the window 5"),
    (lambda: fd.Conv2D((5, 5, 3, 6), padding='full'), fd.ArgumentError, "Conv2D: padding must be 'valid' or 'same', got 'full'"),
    (lambda: fd.Conv2D((5, 5, 3, 6), padding=None), fd.ArgumentError, "padding must be 'valid' or 'same'"),
    (lambda: fd.Conv2D((5, 5, 3, 6), strides=(0, 1)), fd.ArgumentError, "Conv2D: strides must be two positive whole numbers"),
    (lambda: fd.Conv2D((5, 5, 3, 6), strides=(1, 1, 1)), fd.ArgumentError, "strides must be two"),
    (lambda: fd.Conv2D((5, 5, 3, 6), strides=1.5), fd.ArgumentError, "strides must be two"),
    (lambda: fd.Conv2D((5, 5, 3, 6), strides=(True, 1)), fd.ArgumentError, "strides must be two"),
    (lambda: fd.Conv2D((5, 5, 3)), fd.ArgumentError, "filter_shape must be four positive whole numbers"),
    (lambda: fd.Conv2D((5, 5, 0, 6)), fd.ArgumentError, "filter_shape must be four"),
    (lambda: fd.Conv2D(), fd.ArgumentError, "give filter_shape (a new layer) or filter (yours), not neither"),
    (lambda: fd.Conv2D((1, 1, 1, 1), filter=np.ones((1, 1, 1, 1))), fd.ArgumentError, "not both"),
    (lambda: fd.Conv2D(filter=np.ones((3, 3, 1))), fd.ShapeError, "Conv2D: filter must be 4-d"),
    (lambda: fd.Conv2D(filter=np.ones((3, 3, 1, 2)), bias=np.ones(3)), fd.ShapeError, "bias must have shape (2,)"),
    (lambda: fd.Conv2D((3, 3, 1, 2), activation='relu'), fd.ArgumentError, "activation must be a function"),
    (lambda: fd.Conv2D((3, 3, 1, 2), rng=3), fd.ArgumentError, "rng must be a random generator"),
    (lambda: fd.conv2d(np.ones((1, 5, 5, 2)), np.ones((3, 3, 2))), fd.ShapeError, "conv2d: the filter must be 4-d"),
    (lambda: fd.conv2d(np.ones((1, 5, 5, 2)), np.ones((3, 3, 2, 1)), padding='SAME!'), fd.ArgumentError, "conv2d: padding"),
    (lambda: fd.MaxPool2D(strides=2.5), fd.ArgumentError, "MaxPool2D: strides must be two positive whole numbers"),
    (lambda: fd.MaxPool2D(pool_size=(2, -1)), fd.ArgumentError, "MaxPool2D: pool_size must be"),
    (lambda: fd.MaxPool2D(padding='causal'), fd.ArgumentError, "MaxPool2D: padding must be 'valid' or 'same'"),
    (lambda: fd.MaxPool2D()(np.ones((2, 4, 4))), fd.ShapeError, "MaxPool2D: the input must be 4-d"),
    (lambda: fd.MaxPool2D(pool_size=3)(np.ones((1, 2, 2, 1))), fd.ShapeError, "max_pool2d: with 'valid' padding each window must fit"),
    (lambda: fd.Flatten()(np.float64(1.0)), fd.ShapeError, "Flatten: the input needs a batch axis"),
    (lambda: fd.softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 1, 2])), fd.ShapeError, "labels must have shape (2,)"),
    (lambda: fd.softmax_cross_entropy(np.zeros((2, 3)), np.array([[0], [1]])), fd.ShapeError, "labels must have shape (2,)"),
    (lambda: fd.softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 3])), fd.ArgumentError, "labels must lie in 0..2 for 3 classes, got values from 0 to 3"),
    (lambda: fd.softmax_cross_entropy(np.zeros((2, 3)), np.array([-1, 0])), fd.ArgumentError, "must lie in 0..2"),
    (lambda: fd.softmax_cross_entropy(np.zeros((2, 3)), np.array([0., 1.])), fd.ArgumentError, "labels must be an array of integer class indices, got float64"),
    (lambda: fd.softmax_cross_entropy(np.zeros((2, 3)), [0, 1]), fd.ArgumentError, "integer class indices, got list"),
    (lambda: fd.softmax_cross_entropy(np.zeros(3), np.array([0])), fd.ShapeError, "logits must be 2-d (batch, classes)"),
    (lambda: fd.applied_for_backpropagation(3, np.ones(2)), fd.ArgumentError, "model must be a layer"),
]

@pytest.mark.parametrize('call,error,message', ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_errors_are_clear(call, error, message):
    with pytest.raises(error) as info: call()
    assert message in str(info.value), str(info.value)
    assert isinstance(info.value, fd.FastADError)

def test_errors_inside_a_transform_name_the_layer():
    conv = fd.Conv2D((3, 3, 3, 2))
    with pytest.raises(fd.ShapeError, match="Conv2D: the input has 1 channels"):
        fd.gradient(lambda x: conv(x).sum(), np.ones((1, 5, 5, 1), np.float32))
    with pytest.raises(fd.ShapeError, match="labels must have shape"):
        fd.gradient(lambda z: fd.softmax_cross_entropy(z, np.array([1])), np.ones((2, 3)))

def test_max_pool_routes_a_nan_windows_cotangent_to_its_first_nan():
    "As argmax (and PyTorch) have it: the NaN that makes the output NaN gets the cotangent, not a pixel before it."
    x = np.arange(16, dtype=np.float64).reshape(1, 4, 4, 1)
    x[0, 0, 1, 0] = np.nan                              # top-left window: its second pixel
    x[0, 3, 2, 0] = x[0, 3, 3, 0] = np.nan              # bottom-right window: two NaNs, the first in row order wins
    y, chain = fd.cnn.max_pool2d_vwc(x)
    assert np.isnan(y[0, 0, 0, 0]) and np.isnan(y[0, 1, 1, 0])
    dx = chain(np.ones_like(y))[0, :, :, 0]
    assert dx[0, 1] == 1 and dx[0, 0] == 0 and dx[1, 1] == 0
    assert dx[3, 2] == 1 and dx[3, 3] == 0 and dx[2, 3] == 0
    assert dx.sum() == 4


# --- second order through the CNN --------------------------------------------------------------------------

# Its own: one directional difference along a random direction, far cheaper than numerical_gradient's every coordinate.
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

# --- empty batches -------------------------------------------------------------------------------------------

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


def test_the_cnn_rules_give_a_domain_and_leave_what_they_read_to_their_closures():
    "Each of the 7 rules names where its property tests draw (`domain=`); what a chain reads, `fastad.locks` finds in its closure."
    from fastad import cnn, locks
    rules = {p.name + ('' if p is not cnn._conv else ' (bias-free)'): p for p in
             (conv2d, cnn._conv, cnn._conv_dx, cnn._conv_dfilter, max_pool2d, cnn._pool_scatter, cnn._pool_gather,
              fd.softmax_cross_entropy)}
    assert len(rules) == 8 and {p.domain.split(':')[0] for p in rules.values()} == {'conv', 'pool', 'logits'}
    x, f = np.random.rand(1, 4, 4, 2), np.random.rand(2, 2, 2, 3)
    _, (dx, df) = cnn._conv_vwc(x, f, strides=(1, 1), amounts=((0, 0), (0, 0)))
    assert locks.keeps(dx, f) and locks.keeps(df, x)            # each input's chain reads the other input
    logits, labels = np.random.rand(2, 3), np.array([0, 2])
    _, pb = fd.value_with_pullback(lambda x, f: conv2d(x, f).sum(), x, f)
    assert not x.flags.writeable and not f.flags.writeable      # each chain reads the other input: both locked
    del pb
    assert x.flags.writeable and f.flags.writeable
    _, pb = fd.value_with_pullback(lambda l: fd.softmax_cross_entropy(l, labels), logits)
    assert labels.flags.writeable                                # its chain reads its own one-hot rows, not the labels
    del pb
