"Models as a PyTorch, Keras or JAX user writes them, and the pieces of a training loop: fields, rebuilding, derived values, frozen models, tied layers, SGD and Adam."
import dataclasses, functools, inspect
import numpy as np
import pytest
import fastad as fd
from fastad.errors import ArgumentError, DifferentiationError
from fastad.tree import flatten

def close(a, b, tol=1e-6): np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
X = np.ones((2, 3), np.float32)

# --- parameters assigned in __init__ or __post_init__ are refused, with the field form ----------------------
class TorchNet(fd.Layer):
    def __init__(self): self.l1 = fd.Dense(3, 1)
    def forward(self, x): return self.l1(x)

class TorchNetWithArgs(fd.Layer):
    def __init__(self, n): self.l1, self.scale = fd.Dense(n, 1), np.ones(1, np.float32)
    def forward(self, x): return self.l1(x) * self.scale

@pytest.mark.parametrize('transform', [fd.gradient, fd.value_with_gradient, fd.pullback])
@pytest.mark.parametrize('net', [TorchNet, lambda: TorchNetWithArgs(3)], ids=['no-args', 'args'])
def test_a_model_with_parameters_set_in_its_own_init_is_refused(transform, net):
    with pytest.raises(DifferentiationError) as e: transform(lambda n: n(X).sum(), net())
    assert "argument 0.l1 is a Dense" in str(e.value) and "__init__ set, but it is not a field" in str(e.value)
    assert "l1: fd.Dense" in str(e.value) and "Net(l1=fd.Dense(3, 1))" in str(e.value)   # the form that works

def test_an_optimizer_refuses_such_a_model_at_once():
    for make in (fd.SGD, fd.Adam):
        with pytest.raises(DifferentiationError, match="TorchNet.l1 is a Dense that TorchNet.__init__ set"): make(TorchNet())

class Unset(fd.Differentiable):
    w: np.ndarray
    def __post_init__(self): self.b = np.array([2.0])

def test_an_array_set_in_post_init_from_nothing_is_refused():
    with pytest.raises(DifferentiationError, match=r"Unset.b is an? ndarray that __post_init__ set, but it is not a field"):
        fd.gradient(lambda m: (m.w * m.b * 3).sum(), Unset(np.array([2.0])))    # was: g.b == [2.], its own value

def test_values_derived_in_post_init_and_plain_settings_still_work():
    class Derived(fd.Differentiable):
        w: np.ndarray
        def __post_init__(self): self.twice, self.eps = self.w * 2, 1e-3   # derived from w; a float setting
    close(fd.gradient(lambda m: (m.twice * m.w).sum() + m.eps, Derived(np.ones(3))).w, [4.0, 4.0, 4.0])
    class Constant(fd.Differentiable):
        w: np.ndarray
        mask: np.ndarray = fd.nondifferentiable(init=False)
        def __post_init__(self): self.mask = np.array([1.0, 0.0])
    close(fd.gradient(lambda m: (m.w * m.mask).sum(), Constant(np.ones(2))).w, [1.0, 0.0])

# --- tree_map, Sequential, SGD with momentum, Adam, has_aux ------------------------------------------------
def dense(n_in, n_out, seed, **kw): return fd.Dense(n_in, n_out, rng=np.random.default_rng(seed), **kw)

def test_tree_map_scales_a_gradient_and_keeps_static_fields():
    layer = dense(3, 2, 0, activation=fd.relu)
    g = fd.gradient(lambda m: m(X).sum(), layer)
    scaled = fd.tree_map(lambda v: 0.1 * v, g)                          # `0.1 * g` is a TypeError: a model is no array
    assert type(scaled) is fd.Dense and scaled.activation is fd.relu
    close(scaled.weight, 0.1 * g.weight); assert scaled.weight.dtype == np.float32
    tree = {'a': [1.0, (np.ones(2), 3)], 'm': layer}
    got = fd.tree_map(lambda x, y: x + y, tree, tree)
    assert got['a'][0] == 2.0 and got['a'][1][1] == 3 and type(got['a'][1]) is tuple
    close(got['a'][1][0], [2.0, 2.0]); close(got['m'].bias, 2 * layer.bias)
    with pytest.raises(DifferentiationError, match=r"tree_map: rest\[0\] is a list of 1 items"): fd.tree_map(lambda a, b: a, [1.0, 2.0], [1.0])

def test_sequential_is_a_layer_whose_gradient_holds_the_layers_gradients():
    model = fd.Sequential([dense(3, 4, 1, activation=np.tanh), dense(4, 1, 2)])
    assert isinstance(model, fd.Layer)
    close(model(X), fd.sequenced(X, through=model.layers))
    g = fd.gradient(lambda m: m(X).sum(), model)
    assert type(g) is fd.Sequential and [type(l) for l in g.layers] == [fd.Dense, fd.Dense]
    close(g.layers[1].bias, [2.0])
    with pytest.raises(ArgumentError, match=r"Sequential: layers\[1\] is a int, not a layer"): fd.Sequential([model, 3])

def model_and_gradients(steps):
    "A model, and a gradient at each of `steps` points (a fixed sequence, so a hand-written optimizer can follow it)."
    model = fd.Sequential([dense(3, 2, 3, activation=np.tanh), dense(2, 1, 4)])
    rng = np.random.default_rng(5)
    return model, [fd.tree_map(lambda w: rng.standard_normal(np.shape(w)).astype(np.float32), model) for _ in range(steps)]

def leaves(m): return fd.tree.flatten(m, static_ok=True)[0]

def test_sgd_with_momentum_follows_pytorchs_formula():
    model, grads = model_and_gradients(3)
    w = [x.astype(np.float64) for x in leaves(model)]
    opt, buf = fd.SGD(model, learning_rate=0.1, momentum=0.9), None
    for g in grads:
        opt.update(model, along=g)
        gs = leaves(g)
        buf = list(gs) if buf is None else [0.9 * b + x for b, x in zip(buf, gs)]     # torch.optim.SGD, dampening 0
        w = [p - 0.1 * b for p, b in zip(w, buf)]
    for got, want in zip(leaves(model), w): close(got, want, 1e-5); assert got.dtype == np.float32

def test_adam_follows_pytorchs_formula():
    model, grads = model_and_gradients(4)
    w = [x.astype(np.float64) for x in leaves(model)]
    opt = fd.Adam(model, learning_rate=0.01, betas=(0.8, 0.99), eps=1e-6)
    m = [np.zeros_like(p) for p in w]; v = [np.zeros_like(p) for p in w]
    for t, g in enumerate(grads, 1):
        opt.update(model, along=g)
        for i, x in enumerate(leaves(g)):                                     # torch.optim.Adam, no weight decay
            m[i] = 0.8 * m[i] + 0.2 * x; v[i] = 0.99 * v[i] + 0.01 * x * x
            w[i] = w[i] - 0.01 * (m[i] / (1 - 0.8 ** t)) / (np.sqrt(v[i] / (1 - 0.99 ** t)) + 1e-6)
    for got, want in zip(leaves(model), w): close(got, want, 1e-5); assert got.dtype == np.float32

def test_optimizers_check_their_arguments_and_show_their_signatures():
    model = dense(2, 2, 0)
    with pytest.raises(ArgumentError, match="SGD: momentum must be a non-negative number"): fd.SGD(model, 0.1, momentum=-1)
    with pytest.raises(ArgumentError, match="Adam: betas must be two numbers"): fd.Adam(model, betas=(0.9,))
    with pytest.raises(DifferentiationError, match="Adam.update: the gradient is a Sequential, but this optimizer was made for a Dense"):
        fd.Adam(model).update(model, along=fd.Sequential([]))
    assert str(inspect.signature(fd.SGD)) == "(model, learning_rate=0.01, momentum=0.0)"
    assert str(inspect.signature(fd.Adam)) == "(model, learning_rate=0.001, betas=(0.9, 0.999), eps=1e-08)"

def test_has_aux_as_in_jax():
    def f(w): return (w * w).sum(), {'predictions': w * 2, 'n': 3}
    w = np.array([1.0, 2.0])
    (value, aux), g = fd.value_with_gradient(f, w, has_aux=True)
    assert value == 5.0 and aux['n'] == 3 and type(aux['predictions']) is np.ndarray
    close(g, [2.0, 4.0]); close(aux['predictions'], [2.0, 4.0])
    g2, aux2 = fd.gradient(f, w, has_aux=True)
    close(g2, [2.0, 4.0]); assert aux2['n'] == 3
    g3, _ = fd.gradient(f, has_aux=True)(w)
    close(g3, [2.0, 4.0])
    outer = fd.gradient(lambda s: fd.gradient(lambda w: ((w * s) ** 2, w * s), 1.0, has_aux=True)[1], 3.0)
    assert outer == 1.0                                               # the aux of an inner transform keeps the outer derivative
    with pytest.raises(DifferentiationError, match=r"has_aux=True: f must return a pair \(value, aux\)"):
        fd.value_with_gradient(lambda w: (w.sum(), 1, 2), w, has_aux=True)

# --- signatures and fields from the class statement ---------------------------------------------------
@pytest.mark.parametrize('layer, names', [(fd.MaxPool2D, ['pool_size', 'strides', 'padding']), (fd.Sequential, ['layers']),
                                         (fd.ActivationDiscarding, ['wrapped']), (fd.Dense, ['input_size', 'output_size', 'activation']),
                                         (fd.Conv2D, ['filter_shape', 'strides', 'padding', 'activation'])])
def test_layers_show_their_parameters(layer, names):
    assert list(inspect.signature(layer).parameters)[:len(names)] == names      # MaxPool2D's was `()`

def test_models_are_dataclasses_from_their_class_statement():
    class Fresh(fd.Layer):
        w: np.ndarray
        tag: str = fd.nondifferentiable(default='x')
    assert [f.name for f in dataclasses.fields(Fresh)] == ['w', 'tag']         # no instance needed
    assert str(inspect.signature(Fresh)) == "(w: numpy.ndarray, tag: str = 'x') -> None"
    assert dataclasses.fields(Fresh)[1].metadata['differentiable'] is False

def test_an_explicit_decorator_keeps_the_last_word():
    @dataclasses.dataclass(frozen=True)
    class Frozen(fd.Differentiable):
        w: np.ndarray
        seen: list = dataclasses.field(default_factory=list)
        tag: str = fd.nondifferentiable(default='f')
    m = Frozen(np.ones(2))
    with pytest.raises(dataclasses.FrozenInstanceError): m.w = None
    g = fd.gradient(lambda m: (m.w ** 2).sum(), m)
    assert type(g) is Frozen and g.tag == 'f' and g.seen == []; close(g.w, [2.0, 2.0])
    @dataclasses.dataclass(kw_only=True)
    class KeywordsOnly(fd.Differentiable):
        a: float = 1.0
        w: np.ndarray                                                  # after a default: only kw_only allows it
    assert fd.gradient(lambda m: (m.w * m.a).sum(), KeywordsOnly(w=np.ones(2), a=3.0)).a == 2.0

# --- Dense has no activation unless given one -----------------------------------------------------------------
def test_dense_defaults_to_no_activation():
    layer = fd.Dense(weight=np.array([[-1.0]]), bias=np.array([0.0]))
    assert layer.activation is None and fd.Dense(2, 3).activation is None
    close(layer(np.array([[2.0]])), [[-2.0]])                           # was relu: 0
    assert dataclasses.fields(fd.Dense)[2].default is None

# --- models rebuilt exactly -----------------------------------------------------------------------------------
def test_a_model_with_an_initvar_is_refused():
    class Scaled(fd.Differentiable):
        w: np.ndarray
        k: dataclasses.InitVar[float] = 1.0
        def __post_init__(self, k): self.k_ = k
    with pytest.raises(DifferentiationError, match="Scaled has InitVar k: fastad rebuilds a model from its fields"):
        fd.value_with_gradient(lambda m: (m.w * m.k_).sum(), Scaled(np.array([1.0, 2.0]), k=3.0))   # was 3.0, not 9.0

@pytest.mark.parametrize('make', [lambda m: fd.SGD(m, learning_rate=0.1), lambda m: fd.SGD(m, 0.1, momentum=0.9),
                                  lambda m: fd.Adam(m, learning_rate=0.1)], ids=['sgd', 'momentum', 'adam'])
def test_a_layer_twice_in_a_list_stays_one_layer_moved_by_both_parts(make):
    shared = dense(2, 2, 0, activation=np.tanh)
    tied, apart = fd.Sequential([shared, shared]), fd.Sequential([dense(2, 2, 0, activation=np.tanh)])
    x = np.array([[0.5, -1.0]], np.float32)
    g = fd.gradient(lambda m: m(x).sum(), tied)
    opt = make(tied)
    for _ in range(2): opt.update(tied, along=fd.gradient(lambda m: m(x).sum(), tied))
    assert tied.layers[0] is tied.layers[1] is shared
    # the same steps, as a model with one parameter whose gradient is the sum of both parts
    class Twice(fd.Layer):
        layer: fd.Dense
        def forward(self, x): return self.layer(self.layer(x))
    once = Twice(dense(2, 2, 0, activation=np.tanh))
    opt2 = make(once)
    for _ in range(2): opt2.update(once, along=fd.gradient(lambda m: m(x).sum(), once))
    close(shared.weight, once.layer.weight, 1e-5); close(shared.bias, once.layer.bias, 1e-5)

def test_move_of_a_list_with_a_layer_twice_moves_it_once_by_the_sum():
    shared = dense(2, 2, 0)
    model, before = fd.Sequential([shared, shared]), shared.bias.copy()
    step = fd.tree_map(lambda w: np.ones_like(w), model)
    model.move(along=step)
    assert model.layers[0] is shared is model.layers[1]; close(shared.bias, before + 2)

def test_a_model_that_contains_itself_is_a_clear_error():
    model = fd.Sequential([dense(2, 2, 0)])
    model.layers.append(model)
    for action in (lambda: fd.gradient(lambda m: m.layers[0](X[:, :2]).sum(), model), lambda: fd.SGD(model),
                   lambda: fd.tree_map(lambda w: w, model), lambda: fd.without_derivative(model)):
        with pytest.raises(DifferentiationError, match="contains itself"): action()

class Gaussian(fd.Differentiable):
    mu: float
    sigma: float
    def __post_init__(self):
        if not self.sigma > 0: raise ValueError("sigma must be positive")

def test_a_gradient_is_built_without_the_models_validation():
    m = Gaussian(0.0, 1.0)
    g = fd.gradient(lambda m: m.mu - 2 * m.sigma, m)                   # d/dsigma = -2: not a valid sigma, a valid gradient
    assert type(g) is Gaussian and (g.mu, g.sigma) == (1.0, -2.0)
    step = fd.tree_map(lambda v: -v, fd.tree_map(lambda v: -v, g))
    assert step.sigma == -2.0
    fd.SGD(m, learning_rate=0.1).update(m, along=g)
    assert (m.mu, m.sigma) == (-0.1, 1.2)
    with pytest.raises(ValueError, match="sigma must be positive"): Gaussian(0.0, -1.0)    # the model still checks itself

# --- state that carries over: optimizer state, half-done updates, settings on the instance, integer fields ----------
class Vec(fd.Differentiable):
    w: np.ndarray

@pytest.mark.parametrize('make', [lambda m: fd.SGD(m, learning_rate=0.1, momentum=0.9), lambda m: fd.Adam(m, learning_rate=0.1)],
                         ids=['momentum', 'adam'])
def test_a_parameter_of_another_shape_is_refused_with_its_state_and_a_new_optimizer_starts_afresh(make):
    m = Vec(np.array([1.0]))
    opt = make(m)
    opt.update(m, along=Vec(np.array([5.0])))
    bigger = Vec(np.zeros(3))                        # was moved to [-0.45, -0.45, -0.55] by SGD, the old velocity broadcast
    with pytest.raises(fd.ShapeError, match=r"Vec.w now has shape \(3,\), but the .* this optimizer kept for it from earlier "
                                            r"steps has shape \(1,\).*make a new optimizer"):
        opt.update(bigger, along=Vec(np.array([0.0, 0.0, 1.0])))
    close(bigger.w, [0.0, 0.0, 0.0])
    fresh = make(bigger)
    fresh.update(bigger, along=Vec(np.array([0.0, 0.0, 1.0])))
    close(bigger.w, [0.0, 0.0, -0.1])

def test_a_model_of_another_structure_is_refused_by_the_optimizer_it_outgrew():
    model = fd.Sequential([dense(3, 2, 0)])
    opt = fd.SGD(model, learning_rate=0.1, momentum=0.9)
    opt.update(model, along=fd.gradient(lambda m: m(X).sum(), model))
    model.layers.append(dense(2, 1, 1))
    with pytest.raises(DifferentiationError, match=r"SGD.update: the model's parameters are not those this optimizer's "
                                                   r"velocity was kept for .*make a new optimizer, SGD\(model, ...\)"):
        opt.update(model, along=fd.gradient(lambda m: m(X).sum(), model))

class Pair(fd.Differentiable):
    a: np.ndarray
    b: np.ndarray

def test_move_that_is_refused_moves_nothing():
    p = Pair(np.ones(2), np.ones(2))
    with pytest.raises(fd.ShapeError, match=r"move: along.b has shape \(3,\), but the field has shape \(2,\): nothing was moved"):
        p.move(along=Pair(np.ones(2), np.ones(3)))
    close(p.a, [1.0, 1.0])                                                       # was [2, 2]: a had moved before b was refused
    m = Gaussian(0.0, 1.0)
    with pytest.raises(ValueError, match="sigma must be positive"): m.move(along=Gaussian(1.0, -2.0))
    assert (m.mu, m.sigma) == (0.0, 1.0)                                         # __post_init__ refused: the old values are back

@pytest.mark.parametrize('make', [lambda m: fd.SGD(m, learning_rate=0.1, momentum=0.9), lambda m: fd.Adam(m, learning_rate=0.1)],
                         ids=['momentum', 'adam'])
def test_a_refused_update_leaves_model_and_optimizer_as_they_were_and_the_next_one_works(make):
    p = Pair(np.ones(2), np.ones(2))
    opt = make(p)
    with pytest.raises(fd.ShapeError, match=r"update: along.b has shape \(3,\), but the model's Pair.b has shape \(2,\): "
                                            r"nothing was changed"):
        opt.update(p, along=Pair(np.ones(2), np.ones(3)))
    close(p.a, [1.0, 1.0]); close(p.b, [1.0, 1.0])
    assert vars(opt) == vars(make(Pair(np.ones(2), np.ones(2))))  | {'model_class': Pair}     # a new optimizer's state
    opt.update(p, along=Pair(np.ones(2), np.ones(2)))             # was a raw broadcast ValueError: a (3,) state was kept
    close(p.a, [0.9, 0.9]); close(p.b, [0.9, 0.9])
    if isinstance(opt, fd.Adam): assert opt.steps == 1

class Tempered(fd.Differentiable):
    w: np.ndarray
    temperature = 1.0                                     # a class attribute, not a field
    def __call__(self, x): return np.log(np.exp(x * self.w / self.temperature).sum())

def test_a_class_attribute_set_again_on_the_instance_is_read_from_the_instance():
    m, x = Tempered(np.array([0.3, -0.2, 0.5])), np.array([1.0, 2.0, 3.0])
    m.temperature = 4.0
    value, g = fd.value_with_gradient(lambda m: m(x), m)
    close(value, m(x)); close(value, 1.2348064199)               # was 1.872 inside the transform: temperature read as 1.0
    e = 1e-6
    def at(w): t = Tempered(w); t.temperature = 4.0; return t(x)
    close(g.w, [(at(m.w + e * d) - at(m.w - e * d)) / (2 * e) for d in np.eye(3)], 1e-6)
    assert g.temperature == 4.0 and fd.tree_map(lambda w: 2 * w, m).temperature == 4.0
    vector, unravel = fd.ravel(m); assert unravel(vector).temperature == 4.0
    for opt in (fd.SGD(m, 0.1, momentum=0.9), fd.Adam(m)):
        opt.update(m, along=g); assert m.temperature == 4.0
    assert opt.m.temperature == 4.0

def test_an_array_set_on_the_instance_is_refused_with_the_field_form():
    m = Tempered(np.ones(3)); m.temperature = np.array(4.0)
    with pytest.raises(DifferentiationError, match=r"(?s)Tempered.temperature is a ndarray set on the model after it was made, "
                                                   r"but it is not a field of Tempered.*temperature: object = fd.nondifferentiable"):
        fd.gradient(lambda m: m(np.ones(3)), m)
    class Derived(fd.Differentiable):
        w: np.ndarray
        scale = 1.0
        def __post_init__(self): self.twice = self.w * 2
    d = Derived(np.ones(2)); d.scale = 2.0
    close(fd.gradient(lambda d: (d.twice / d.scale).sum(), d).w, [1.0, 1.0])        # was [2, 2]: scale read as 1.0
    d.scale = np.ones(2)                                  # over a plain class attribute: a parameter fastad would not see
    with pytest.raises(DifferentiationError, match="Derived.scale is a ndarray set on the model after it was made"):
        fd.gradient(lambda d: (d.twice * d.scale).sum(), d)

class Cached(fd.Differentiable):
    w: np.ndarray
    @functools.cached_property
    def scale(self): return np.sum(self.w ** 2)           # a cache in the instance's __dict__, not a setting
    @functools.cached_property
    def total(self): return float(np.sum(self.w))

class CachedDerived(Cached):                              # built through its constructor, not field by field
    def __post_init__(self): self.twice = self.w * 2

@pytest.mark.parametrize('cls', [Cached, CachedDerived])
def test_an_array_cached_property_is_computed_again_not_refused(cls):
    m = cls(np.array([1.0, 2.0])); assert m.scale == 5.0                    # cached on the instance
    close(fd.gradient(lambda m: m.scale * m.w[0], m).w, [7.0, 4.0])        # was refused: "set on the model after it was made"
    close(fd.tree_map(lambda a: a * 10, m).scale, 500.0)
    vector, unravel = fd.ravel(m); close(unravel(2 * vector).scale, 20.0)
    for opt in (fd.SGD(m, 0.1), fd.Adam(m)):
        opt.update(m, along=fd.gradient(lambda m: m.scale, m))

@pytest.mark.parametrize('cls', [Cached, CachedDerived])
def test_a_float_cached_property_is_not_carried_stale(cls):
    n = cls(np.array([1.0, 2.0])); assert n.total == 3.0
    assert fd.tree_map(lambda a: a * 10, n).total == 30.0                  # was 3.0, the model's cache
    vector, unravel = fd.ravel(n); assert unravel(2 * vector).total == 6.0
    assert 'total' not in fd.gradient(lambda n: n.w.sum(), n).__dict__

class Offsets(fd.Differentiable):
    w: np.ndarray
    def __call__(self, x): return ((x * self.w - np.array([1.0, 2.0])) ** 2).sum()

class Scale(fd.Differentiable):
    s: float
    n: int = 2

def test_a_field_holding_integers_is_refused_not_a_silent_constant():
    with pytest.raises(DifferentiationError, match=r"argument 0.w is an integer \(ndarray of int64\), in a differentiable field "
                                                   r"of Offsets.*np.array\(\[0.0, 0.0\]\).*`w: np.ndarray = fd.nondifferentiable\(\)`"):
        fd.gradient(lambda m: m(np.ones(2)), Offsets(np.array([0, 0])))      # was a "gradient" of [0, 0], the value itself
    with pytest.raises(DifferentiationError, match=r"Offsets.w is an integer"): fd.Adam(Offsets(np.array([0, 0])))
    with pytest.raises(DifferentiationError, match=r"argument 0.s is an integer \(int\).*write 1.0, not 1.*"
                                                   r"`s: float = fd.nondifferentiable\(\)`"):
        fd.gradient(lambda m: 3.0 * m.s, Scale(1))
    g = fd.gradient(lambda m: 3.0 * m.s * m.n, Scale(1.0))                       # a count annotated int is a setting
    assert (g.s, g.n) == (6.0, 2)
    m = Offsets(np.array([0.0, 0.0])); opt = fd.Adam(m, learning_rate=0.1)
    for _ in range(300): opt.update(m, along=fd.gradient(lambda m: m(np.ones(2)), m))
    assert m(np.ones(2)) < 1e-6                                                   # floats train (integers stayed at 3.98)


# ---- derived values after a step, tied layers in an optimizer ------------------------------------------------------
def close_tight(a, b): np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)

# --- derived values follow a move; a gradient carries none -------------------------------------------------------
class CachedTwice(fd.Differentiable):
    w: np.ndarray
    def __post_init__(self): self.cache = self.w * 2                 # derived from w

def loss(m): return (m.cache * m.w).sum()

@pytest.mark.parametrize('make', [lambda m: fd.SGD(m, learning_rate=0.1), lambda m: fd.Adam(m, learning_rate=0.1),
                                  lambda m: fd.SGD(m, learning_rate=0.1, momentum=0.9)], ids=['sgd', 'adam', 'momentum'])
def test_after_an_update_the_plain_and_the_traced_forward_agree(make):
    m = CachedTwice(np.array([1.0, 2.0]))
    opt = make(m)
    for _ in range(2): opt.update(m, along=fd.gradient(loss, m))
    close_tight(m.cache, 2 * m.w)                                           # was: [2, 4], stale, while 2 w = [1.2, 2.4]
    close_tight(loss(m), fd.value_with_gradient(loss, m)[0])                # was: 6.0 plain, 3.6 traced

def test_move_derives_an_outer_models_values_from_its_moved_parts():
    class Outer(fd.Differentiable):
        inner: CachedTwice
        b: np.ndarray
        def __post_init__(self): self.total = self.inner.cache.sum() + self.b.sum()
    m = Outer(CachedTwice(np.array([1.0])), np.array([1.0]))
    m.move(along=Outer(CachedTwice(np.array([1.0])), np.array([1.0])))
    close_tight(m.inner.w, [2.0]); close_tight(m.inner.cache, [4.0]); close_tight(m.total, 6.0)   # the inner cache first, then the total

def test_a_gradient_carries_no_derived_value_of_the_model():
    m = CachedTwice(np.array([1.0, 2.0]))
    g = fd.gradient(loss, m)
    close_tight(g.w, [4.0, 8.0])
    assert not hasattr(g, 'cache')                                    # was: g.cache is m.cache
    class Declared(fd.Differentiable):
        w: np.ndarray
        cache: np.ndarray = dataclasses.field(init=False)
        unit: str = fd.nondifferentiable(init=False)                  # a setting rides along
        def __post_init__(self): self.cache, self.unit = self.w * 2, 'm'
    d = Declared(np.array([1.0, 2.0]))
    g = fd.gradient(loss, d)
    close_tight(g.w, [4.0, 8.0]); assert g.cache is None and g.unit == 'm'
    repr(g)                                                           # every field still there to print
    close_tight(d.cache, [2.0, 4.0])                                        # the model keeps its own

# --- tied layers: one optimizer state per parameter; eps > 0 ----------------------------------------------------
def tied(dtype=np.float64):
    d = fd.Dense(weight=np.array([[1., 0.5], [0.2, 1.]], dtype), bias=np.array([0.1, -0.1], dtype))
    return fd.Sequential([d, d])

def test_a_layer_used_twice_gets_one_optimizer_state():
    model = tied()
    opt = fd.Adam(model, learning_rate=0.1)
    opt.update(model, along=fd.gradient(lambda m: (m(np.array([[1., 2.]])) ** 2).sum(), model))
    assert len(flatten(opt.m, static_ok=True)[0]) == 2               # was 4: zeros kept for the repeat
    assert opt.m.layers[1].weight is None and opt.v.layers[1].bias is None

def test_a_tied_float32_model_takes_a_finite_adam_step_even_with_a_tiny_eps():
    model = tied(np.float32)                                          # 1e-50 is 0 in float32: the repeat's 0/0 was NaN
    opt = fd.Adam(model, learning_rate=0.1, eps=1e-50)
    opt.update(model, along=fd.gradient(lambda m: (m(np.array([[1., 2.]], np.float32)) ** 2).sum(), model))
    assert np.isfinite(model.layers[0].weight).all() and model.layers[0] is model.layers[1]

@pytest.mark.parametrize('eps', [0, 0.0, -1e-8])
def test_adam_refuses_an_eps_that_is_not_positive(eps):
    with pytest.raises(ArgumentError, match="Adam: eps must be a positive number"):
        fd.Adam(tied(), eps=eps)


# ---------------------------------------------------------------- nondifferentiable(default=..., init=False)

class Scaled(fd.Differentiable):
    w: object
    scale: float = fd.nondifferentiable(default=2.0, init=False)        # a constant the constructor does not take
    def __call__(self, x): return self.scale * self.w * x


def test_an_init_false_field_reads_as_its_default():
    m = Scaled(w=np.array([1., 2.]))
    assert m.scale == 2.0 and type(m.scale) is float                     # it was the dataclasses.Field object
    assert repr(m) == "Scaled(w=array([1., 2.]), scale=2.0)"
    g = fd.gradient(lambda m: m(3.0).sum(), m)
    assert type(g) is Scaled and g.scale == 2.0 and np.array_equal(g.w, [6., 6.])
    assert fd.tree_map(lambda v: v * 0, m).scale == 2.0


def test_an_init_false_field_still_reads_as_a_field_on_the_class_and_can_be_set():
    f = dataclasses.fields(Scaled)[1]
    assert isinstance(f, dataclasses.Field) and (f.name, f.init, f.default) == ('scale', False, 2.0)
    assert isinstance(Scaled.__dict__['scale'], dataclasses.Field)        # a later @dataclass above the class sees it
    m = Scaled(w=1.0); m.scale = 5.0
    assert m.scale == 5.0 and Scaled(w=1.0).scale == 2.0


def test_an_init_false_field_without_default_is_missing_until_set():
    class Later(fd.Differentiable):
        w: object
        norm: float = fd.nondifferentiable(init=False)
    with pytest.raises(AttributeError, match="norm"): Later(w=1.0).norm
    class Derived(fd.Differentiable):
        w: object
        norm: float = fd.nondifferentiable(init=False)
        def __post_init__(self): self.norm = abs(self.w)
    assert Derived(w=-3.0).norm == 3.0


def test_a_frozen_model_keeps_init_false_defaults():
    @dataclasses.dataclass(frozen=True)
    class Frozen(fd.Differentiable):
        w: object
        scale: float = fd.nondifferentiable(default=4.0, init=False)
    m = Frozen(w=1.0)
    assert m.scale == 4.0
    with pytest.raises(dataclasses.FrozenInstanceError): m.w = 2.0
    assert fd.gradient(lambda m: m.w * m.scale, m).w == 4.0


# --- models ------------------------------------------------------------------------------------------------------------
def test_a_field_derived_in_post_init_is_differentiated():
    class Doubled(fd.Differentiable):
        w: np.ndarray
        def __post_init__(self): self.cache = self.w * 2
    close(fd.gradient(lambda m: (m.cache * m.w).sum(), Doubled(np.ones(3))).w, [4.0, 4.0, 4.0])   # d/dw 2 w^2

def test_frozen_models():
    @dataclasses.dataclass(frozen=True)
    class Frozen(fd.Differentiable):
        w: np.ndarray
    g = fd.gradient(lambda m: (m.w ** 2).sum(), Frozen(np.ones(3)))
    assert type(g) is Frozen
    close(g.w, [2.0, 2.0, 2.0])
