"""What a recomputed function reads again in the backward pass is locked until then: its constant arguments,
positional or keyword, plain or inside structures, and the layers of a checkpointed sequence. A write into one
between the forward and the backward pass is refused, not turned into a wrong gradient."""
import numpy as np
import pytest
import fastad as fd
from fastad.errors import DifferentiationError

WEIGHTS = np.array([1., 10.])


def swapped(a):
    "Reverse `a` in place: its sums stay the same, so the recomputation's fingerprint cannot see the write."
    a[:] = a[::-1].copy()


def test_a_keyword_array_of_a_recomputed_function_is_locked():
    scaled = fd.make_recomputed_in_gradient(lambda x, c=None: x * c)
    c = np.array([1., 2.])
    def f(x):
        y = scaled(x, c=c)
        swapped(c)
        return (y * WEIGHTS).sum()
    with pytest.raises(DifferentiationError, match="passed to <lambda>"):
        fd.gradient(f, np.ones(2))                                # before: [2, 10], silently (right: [1, 20])
    assert c.flags.writeable and list(c) == [1., 2.]


def test_a_keyword_tuple_of_arrays_of_a_recomputed_function_is_locked():
    picked = fd.make_recomputed_in_gradient(lambda x, cs=(): x * cs[1])
    c0, c1 = np.array([5., 5.]), np.array([1., 2.])
    def f(x):
        y = picked(x, cs=(c0, c1))
        swapped(c1)
        return (y * WEIGHTS).sum()
    with pytest.raises(DifferentiationError, match="passed to <lambda>"):
        fd.gradient(f, np.ones(2))
    assert c1.flags.writeable


def test_a_keyword_array_still_reaches_the_recomputation_unchanged():
    scaled = fd.make_recomputed_in_gradient(lambda x, c=None: x * c)
    c = np.array([1., 2.])
    np.testing.assert_array_equal(fd.gradient(lambda x: (scaled(x, c=c) * WEIGHTS).sum(), np.ones(2)), [1., 20.])
    c[0] = 3.                                                     # released once the gradient is computed
    np.testing.assert_array_equal(fd.gradient(lambda x: (scaled(x, c=c) * WEIGHTS).sum(), np.ones(2)), [3., 20.])


def test_a_constant_inside_a_structured_argument_is_locked():
    first = fd.make_recomputed_in_gradient(lambda x, pair: x * pair[0] + pair[1])
    c = np.array([1., 2.])
    def f(x):
        y = first(x, (c, 1.0))                                    # a tuple: the structured rule, on its leaves
        swapped(c)
        return (y * WEIGHTS).sum()
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.gradient(f, np.ones(2))
    assert c.flags.writeable and list(c) == [1., 2.]             # the write was refused: c is as it was


def test_the_layers_of_a_checkpointed_sequence_are_locked():
    layers = [fd.Dense(weight=np.array([[1., 2.], [3., 4.]]), bias=np.zeros(2)) for _ in range(2)]
    model = fd.checkpoint_sequential(layers, segments=2)
    def f(x):
        y = model(x)                                              # a constant model: its weights are read again
        swapped(layers[0].weight[0])
        return y.sum()
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.gradient(f, np.ones((1, 2)))
    assert layers[0].weight.flags.writeable and list(layers[0].weight[0]) == [1., 2.]
