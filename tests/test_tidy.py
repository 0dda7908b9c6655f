"""Derived values after a step, tied layers in an optimizer, and the lesson helpers' names."""
import dataclasses
import numpy as np, pytest
import fastad as fd
from fastad.errors import ArgumentError
from fastad.tree import flatten

def close(a, b): np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)

# --- derived values follow a move; a gradient carries none -------------------------------------------------------
class Cached(fd.Differentiable):
    w: np.ndarray
    def __post_init__(self): self.cache = self.w * 2                 # derived from w

def loss(m): return (m.cache * m.w).sum()

@pytest.mark.parametrize('make', [lambda m: fd.SGD(m, learning_rate=0.1), lambda m: fd.Adam(m, learning_rate=0.1),
                                  lambda m: fd.SGD(m, learning_rate=0.1, momentum=0.9)], ids=['sgd', 'adam', 'momentum'])
def test_after_an_update_the_plain_and_the_traced_forward_agree(make):
    m = Cached(np.array([1.0, 2.0]))
    opt = make(m)
    for _ in range(2): opt.update(m, along=fd.gradient(loss, m))
    close(m.cache, 2 * m.w)                                           # was: [2, 4], stale, while 2 w = [1.2, 2.4]
    close(loss(m), fd.value_with_gradient(loss, m)[0])                # was: 6.0 plain, 3.6 traced

def test_move_derives_an_outer_models_values_from_its_moved_parts():
    class Outer(fd.Differentiable):
        inner: Cached
        b: np.ndarray
        def __post_init__(self): self.total = self.inner.cache.sum() + self.b.sum()
    m = Outer(Cached(np.array([1.0])), np.array([1.0]))
    m.move(along=Outer(Cached(np.array([1.0])), np.array([1.0])))
    close(m.inner.w, [2.0]); close(m.inner.cache, [4.0]); close(m.total, 6.0)   # the inner cache first, then the total

def test_a_gradient_carries_no_derived_value_of_the_model():
    m = Cached(np.array([1.0, 2.0]))
    g = fd.gradient(loss, m)
    close(g.w, [4.0, 8.0])
    assert not hasattr(g, 'cache')                                    # was: g.cache is m.cache
    class Declared(fd.Differentiable):
        w: np.ndarray
        cache: np.ndarray = dataclasses.field(init=False)
        unit: str = fd.nondifferentiable(init=False)                  # a setting rides along
        def __post_init__(self): self.cache, self.unit = self.w * 2, 'm'
    d = Declared(np.array([1.0, 2.0]))
    g = fd.gradient(loss, d)
    close(g.w, [4.0, 8.0]); assert g.cache is None and g.unit == 'm'
    repr(g)                                                           # every field still there to print
    close(d.cache, [2.0, 4.0])                                        # the model keeps its own

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
