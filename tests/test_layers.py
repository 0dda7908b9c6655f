"""Layers, the loss and the optimizer of lesson 04, and the error paths of with_derivative hooks."""
import dataclasses, warnings
import numpy as np, pytest
import fastad as fd
from fastad.backend import to_device, to_host, array_module, manual_seed
from fastad.errors import ArgumentError, DifferentiationError, ShapeError

def close(a, b, tol=1e-6): np.testing.assert_allclose(to_host(a), to_host(b), rtol=tol, atol=tol)

def dense(n_in=2, n_out=3, seed=0, **kw): return fd.Dense(n_in, n_out, rng=np.random.default_rng(seed), **({"activation": fd.relu} | kw))

# --- Dense --------------------------------------------------------------------------------------------
def test_dense_new_layer_is_seeded_kaiming_normal_float32(any_backend):
    a, b = dense(300, 200, seed=1), dense(300, 200, seed=1)
    assert array_module(a.weight) is any_backend and array_module(a.bias) is any_backend
    assert a.weight.dtype == np.float32 and a.bias.dtype == np.float32
    assert a.weight.shape == (300, 200) and a.bias.shape == (200,)
    close(a.weight, b.weight, 0); close(a.bias, np.zeros(200), 0)
    assert abs(float(to_host(a.weight).std()) - np.sqrt(2 / 300)) < 0.002     # 60,000 draws: std within 3%
    assert a.activation is fd.relu

def test_dense_uses_the_backends_seeded_generator_by_default(any_backend):
    manual_seed(7); a = fd.Dense(4, 5)
    manual_seed(7); b = fd.Dense(4, 5)
    c = fd.Dense(4, 5)                                   # the generator moved on
    close(a.weight, b.weight, 0)
    assert not np.array_equal(to_host(a.weight), to_host(c.weight))

def test_dense_from_its_fields_by_keyword_is_exactly_that_model():
    w, b = np.ones((2, 3), np.float32), np.zeros(3, np.float32)
    d = fd.Dense(weight=w, bias=b, activation=np.tanh)
    assert d.weight is w and d.bias is b and d.activation is np.tanh
    # what a rebuild through the constructor does: every init field by keyword
    again = fd.Dense(**{f.name: getattr(d, f.name) for f in dataclasses.fields(d) if f.init})
    assert (again.weight, again.bias, again.activation) == (w, b, np.tanh)
    assert [f.name for f in dataclasses.fields(fd.Dense)] == ['weight', 'bias', 'activation']

def test_dense_forward_and_gradient_are_a_dense():
    d = fd.Dense(weight=np.array([[1., -1.], [2., 0.5]]), bias=np.array([0., 1.]), activation=fd.relu)
    x = np.array([[1., 1.], [-1., 0.]])
    close(d(x), np.maximum(x @ d.weight + d.bias, 0))
    g = fd.gradient(lambda m: m(x).sum(), d)
    assert type(g) is fd.Dense and g.activation is fd.relu
    mask = (x @ d.weight + d.bias) > 0
    close(g.weight, x.T @ mask); close(g.bias, mask.sum(0))

def test_dense_without_activation_is_linear():
    d = dense(activation=None)
    x = np.ones((2, 2), np.float32)
    close(d(x), x @ d.weight + d.bias)

def test_dense_wrong_input_width_names_the_layer_and_both_shapes(any_backend):
    d = dense(2, 10)
    x = to_device(np.ones((4, 3), np.float32))
    for call in (lambda: d(x), lambda: fd.gradient(lambda m: m(x).sum(), d)):
        with pytest.raises(ShapeError) as e: call()
        assert 'Dense(2 -> 10)' in str(e.value) and '(4, 3)' in str(e.value) and '(2, 10)' in str(e.value)
    with pytest.raises(ShapeError, match=r"Dense\(2 -> 10\): the input has shape \(\)"): d(np.float32(1))

@pytest.mark.parametrize('args, kwargs, error, message', [
    ((0, 3), {}, ArgumentError, "input_size must be a whole number of 1 or more, got 0"),
    ((2, 2.5), {}, ArgumentError, "output_size must be a whole number"),
    ((True, 2), {}, ArgumentError, "input_size must be a whole number"),
    ((None, None), {}, ArgumentError, "input_size must be"),
    ((2, 3), dict(weight=np.ones((2, 3)), bias=np.ones(3)), ArgumentError, "not a mix"),
    ((), dict(weight=np.ones((2, 3))), ArgumentError, "not a mix"),
    ((), dict(weight=np.ones(3), bias=np.ones(3)), ShapeError, "weight (3,) and bias (3,)"),
    ((), dict(weight=np.ones((2, 3)), bias=np.ones(2)), ShapeError, "weight (2, 3) and bias (2,)"),
    ((2, 3, 'relu'), {}, ArgumentError, "activation must be a function (or None), not a str"),
])
def test_dense_refuses_bad_arguments(args, kwargs, error, message):
    with pytest.raises(error) as e: fd.Dense(*args, **kwargs)
    assert message in str(e.value)

def test_layer_subclass_must_define_forward():
    class Empty(fd.Layer): pass
    with pytest.raises(NotImplementedError, match="Empty is a Layer, so it must define forward"): Empty()(1.0)

def test_layer_call_is_forward():
    class Twice(fd.Layer):
        def forward(self, x): return 2 * x
    assert Twice()(3.0) == 6.0 and isinstance(Twice(), fd.Differentiable)

# --- sequenced ----------------------------------------------------------------------------------------
def test_sequenced_applies_layers_in_order():
    assert fd.sequenced(1.0, through=[lambda x: x + 1, lambda x: x * 10]) == 20.0
    assert fd.sequenced(1.0, through=()) == 1.0
    a, b = dense(2, 4), dense(4, 1, seed=1)
    x = np.ones((3, 2), np.float32)
    close(fd.sequenced(x, through=[a, b]), b(a(x)))

def test_sequenced_refuses_what_is_not_a_list_of_layers():
    with pytest.raises(ArgumentError, match="through must be a list or tuple of layers, not a Dense"):
        fd.sequenced(np.ones((1, 2)), through=dense())
    with pytest.raises(ArgumentError, match=r"through\[1\] is a int, not a layer"):
        fd.sequenced(np.ones((1, 2)), through=[dense(), 3])

# --- mse ----------------------------------------------------------------------------------------------
def test_mse_value_and_gradient(any_backend):
    p, e = to_device(np.array([[1.], [2.], [4.]], np.float32)), to_device(np.array([[0.], [2.], [2.]], np.float32))
    close(fd.mse(p, e), 5 / 3)
    g = fd.gradient(fd.mse, p, e)
    close(g[0], 2 * (to_host(p) - to_host(e)) / 3); close(g[1], -2 * (to_host(p) - to_host(e)) / 3)
    assert g[0].dtype == np.float32

def test_mse_refuses_shapes_that_would_broadcast():
    with pytest.raises(ShapeError) as e: fd.mse(np.zeros((4, 1)), np.zeros(4))
    assert "predicted has shape (4, 1) but expected has shape (4,)" in str(e.value) and "broadcast to (4, 4)" in str(e.value)
    with pytest.raises(ShapeError, match="cannot be compared element by element"): fd.mse(np.zeros(3), np.zeros(2))
    with pytest.raises(ShapeError): fd.gradient(lambda p: fd.mse(p, np.zeros(4)), np.zeros((4, 1)))

# --- move and SGD -------------------------------------------------------------------------------------
class Inner(fd.Differentiable):
    w: np.ndarray

class Model(fd.Differentiable):
    inner: Inner
    scale: float
    pair: tuple
    name: str = fd.nondifferentiable(default='m')

class Frozen(fd.Differentiable):
    "A model whose fields cannot be assigned, as in a frozen dataclass."
    w: np.ndarray
    def __init__(self, w): object.__setattr__(self, 'w', w)
    def __setattr__(self, name, value): raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

def test_move_rebinds_fields_to_new_arrays_and_keeps_types():
    w, p0 = np.array([1., 2.], np.float32), np.ones(1, np.float32)
    m = Model(Inner(w), 2.0, (p0, np.float32(3)))
    inner = m.inner
    out = m.move(along=Model(Inner(np.array([0.5, 0.5], np.float32)), 1.0, (np.ones(1, np.float32), np.float32(1)), name='g'))
    assert out is m and m.inner is inner                 # the model and its sub-models are moved in place...
    close(m.inner.w, [1.5, 2.5]); close(w, [1., 2.])     # ...their arrays are new: the old array is unchanged
    assert m.inner.w.dtype == np.float32 and type(m.scale) is float and m.scale == 3.0
    assert type(m.pair) is tuple and type(m.pair[1]) is np.float32 and m.pair[1] == 4 and m.name == 'm'
    close(m.pair[0], [2.]); close(p0, [1.])

def test_move_works_on_frozen_models_and_none_is_no_step():
    f = Frozen(np.zeros(2))
    with pytest.raises(dataclasses.FrozenInstanceError): f.w = np.ones(2)
    f.move(along=Frozen(np.ones(2)))
    close(f.w, [1., 1.])
    m = Model(Inner(np.ones(2)), 1.0, (np.ones(1), 1.0))
    m.move(along=Model(None, None, None))
    close(m.inner.w, [1., 1.]); assert m.scale == 1.0

def test_move_refuses_another_class_or_shape():
    m = Model(Inner(np.ones(2)), 1.0, (np.ones(1), 1.0))
    with pytest.raises(DifferentiationError, match="move: along is a Inner, but the model is a Model"): m.move(along=Inner(np.ones(2)))
    with pytest.raises(ShapeError, match=r"along.w has shape \(3,\), but the field has shape \(2,\)"):
        Inner(np.ones(2)).move(along=Inner(np.ones(3)))
    with pytest.raises(DifferentiationError, match="along.pair"):
        m.move(along=Model(Inner(np.ones(2)), 1.0, [np.ones(1), 1.0]))

def test_sgd_steps_downhill_by_the_learning_rate(any_backend):
    d = dense(2, 3)
    x = to_device(np.ones((4, 2), np.float32))
    loss = lambda m: fd.mse(m(x), to_device(np.zeros((4, 3), np.float32)))
    g = fd.gradient(loss, d)
    before_w, before_b = to_host(d.weight).copy(), to_host(d.bias).copy()
    opt = fd.SGD(d, learning_rate=0.1)
    assert opt.update(d, along=g) is d
    close(d.weight, before_w - 0.1 * to_host(g.weight)); close(d.bias, before_b - 0.1 * to_host(g.bias))
    assert d.weight.dtype == np.float32 and array_module(d.weight) is any_backend and d.activation is fd.relu

def test_sgd_trains_xor_with_a_falling_loss():
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32); y = np.array([[0], [1], [1], [0]], np.float32)
    rng = np.random.default_rng(0)
    layers = [fd.Dense(2, 16, activation=fd.relu, rng=rng), fd.Dense(16, 1, rng=rng)]
    class Net(fd.Layer):
        layers: list
        def forward(self, x): return fd.sequenced(x, through=self.layers)
    net = Net(layers)
    opt, losses = fd.SGD(net, learning_rate=0.1), []
    for _ in range(300):
        loss, g = fd.value_with_gradient(lambda m: fd.mse(m(x), y), net)
        opt.update(net, along=g); losses.append(float(loss))
    assert losses[-1] < losses[0] / 5 and type(net.layers) is list and type(net.layers[0]) is fd.Dense

def test_sgd_refuses_another_models_gradient_and_bad_settings():
    d = dense()
    opt = fd.SGD(d, learning_rate=0.1)
    with pytest.raises(DifferentiationError, match="the gradient is a Inner, but this optimizer was made for a Dense"):
        opt.update(d, along=Inner(np.ones(2)))
    with pytest.raises(DifferentiationError, match="the model is a Inner, but this optimizer was made for a Dense"):
        opt.update(Inner(np.ones(2)), along=Inner(np.ones(2)))
    for lr in (0, -1.0, 'fast', True, float('nan')):
        with pytest.raises(ArgumentError, match="learning_rate must be a positive number"): fd.SGD(d, learning_rate=lr)
    with pytest.raises(ArgumentError, match="model must be a Differentiable model, not a dict"): fd.SGD({'w': np.ones(2)})

# --- with_derivative hooks ----------------------------------------------------------------------------
def hooked(hook): return lambda x: (fd.with_derivative(x, hook) * 2).sum()

@pytest.mark.parametrize('returned, message', [
    (np.ones(2), "the hook returned shape (2,) for a cotangent of shape (3,)"),
    ('big', "the hook returned a str; return None, a number, or an array shaped like the cotangent (shape (3,))"),
    ([1., 2., 3.], "the hook returned a list"),
    (np.array(['a', 'b', 'c']), "the hook returned a ndarray"),
    (True, "the hook returned an integer (bool)"),
])
def test_hook_returning_the_wrong_shape_or_type_is_refused(returned, message):
    with pytest.raises(DifferentiationError) as e: fd.gradient(hooked(lambda g: returned), np.ones(3))
    assert message in str(e.value)

def test_hook_replacements_that_fit(any_backend):
    x = to_device(np.ones(3, np.float32))
    seen = []
    close(fd.gradient(hooked(seen.append), x), [2., 2., 2.]); close(seen[0], [2., 2., 2.])   # observed, unchanged
    close(fd.gradient(hooked(lambda g: 0.5), x), [.5, .5, .5])                      # a number: everywhere
    close(fd.gradient(hooked(lambda g: g * 0 + 3), x), [3., 3., 3.])
    g = fd.gradient(hooked(lambda g: to_device(np.array([1, 2, 3]))), x)              # integers are numbers too
    close(g, [1., 2., 3.]); assert g.dtype == np.float32
    def in_place(g): g[...] = 5
    close(fd.gradient(hooked(in_place), x), [5., 5., 5.])

def test_with_derivative_outside_any_differentiation_is_a_no_op():
    calls, x = [], np.ones(3)
    assert fd.with_derivative(x, calls.append) is x and fd.with_derivative(2.0, calls.append) == 2.0
    assert calls == []
    with pytest.raises(DifferentiationError, match="hook must be callable"): fd.with_derivative(x, 'print')
