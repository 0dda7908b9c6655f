"""Lesson 02's hand-written forward and backward pass: gradients against central differences, argument
checks, and the strict backend (no silent host copies)."""
import numpy as np
import pytest
from hypothesis import given, settings, assume, strategies as st

from fastad.testing import numerical_gradient
from fastad.backend import to_device, to_host
from fastad.errors import FastADError, DifferentiationError
from fastad.errors import ShapeError
from fastad.strict import StrictArray
from fastad.fully_connected import (normalize, load_normalized_mnist, lin, plain_relu, model, column_mse, GradHolder,
                                    mse_grad, relu_grad, lin_grad, forward_and_backward)

NAMES = ('inp', 'w1', 'b1', 'w2', 'b2')


def problem(seed, n, m, nh, dtype=np.float64):
    "Random (inp, w1, b1, w2, b2) and targets for a model with n rows, m features and nh hidden units."
    r = np.random.default_rng(seed)
    args = [r.standard_normal(s).astype(dtype) for s in [(n, m), (m, nh), (nh,), (nh, 1), (1,)]]
    return args, r.standard_normal(n).astype(dtype)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 8), m=st.integers(1, 6), nh=st.integers(1, 5))
def test_manual_gradients_match_central_differences(seed, n, m, nh):
    args, targ = problem(seed, n, m, nh)
    inp, w1, b1 = args[:3]
    assume(np.abs(lin(inp, w1, b1)).min() > 1e-3)      # finite differences are wrong across relu's kink
    holders = [GradHolder(a.copy()) for a in args]
    loss = forward_and_backward(holders[0], targ, *holders[1:])
    np.testing.assert_allclose(loss, column_mse(model(*args), targ), rtol=1e-12)
    expected_all = numerical_gradient(lambda *a: column_mse(model(*a), targ), *args)
    for name, h, a, expected in zip(NAMES, holders, args, expected_all):
        np.testing.assert_allclose(h.grad, expected, rtol=1e-5, atol=1e-7, err_msg=name)
        assert h.grad.shape == a.shape and h.grad.dtype == np.float64, name


def test_gradients_are_not_trivially_zero():
    "The comparison above would pass for an all-zero gradient if the loss were flat: make sure it isn't."
    args, targ = problem(1, 6, 4, 3)
    holders = [GradHolder(a) for a in args]
    forward_and_backward(holders[0], targ, *holders[1:])
    for name, h in zip(NAMES, holders): assert np.abs(h.grad).max() > 1e-3, name


def test_float32_in_float32_out():
    args, targ = problem(2, 5, 4, 3, dtype=np.float32)
    holders = [GradHolder(a) for a in args]
    loss = forward_and_backward(holders[0], targ, *holders[1:])
    assert loss.dtype == np.float32
    for name, h in zip(NAMES, holders): assert h.grad.dtype == np.float32, name


def test_backward_pieces_one_by_one():
    "Each backward function on a case small enough to work out by hand."
    out = GradHolder(np.array([[3.], [1.]]))
    mse_grad(out, np.array([1., 1.]))
    np.testing.assert_array_equal(out.grad, [[2.], [0.]])           # 2/n * (o - y) = [2, 0]
    inp, res = GradHolder(np.array([[-1., 0., 2.]])), GradHolder(np.array([[0., 0., 2.]]))
    res.grad = np.array([[5., 6., 7.]])
    relu_grad(inp, res)
    np.testing.assert_array_equal(inp.grad, [[0., 0., 7.]])         # passes only where the input was > 0
    x, w, b = GradHolder(np.array([[1., 2.]])), GradHolder(np.array([[1., 0., 2.], [0., 1., 3.]])), GradHolder(np.zeros(3))
    z = GradHolder(lin(x.value, w.value, b.value))
    z.grad = np.array([[1., 10., 100.]])
    lin_grad(x, z, w, b)
    np.testing.assert_array_equal(x.grad, [[201., 310.]])
    np.testing.assert_array_equal(w.grad, [[1., 10., 100.], [2., 20., 200.]])
    np.testing.assert_array_equal(b.grad, [1., 10., 100.])


def test_every_grad_is_replaced_not_accumulated():
    "The lesson's point about mutation: a second pass overwrites, it does not add."
    args, targ = problem(3, 4, 3, 2)
    holders = [GradHolder(a) for a in args]
    forward_and_backward(holders[0], targ, *holders[1:])
    first = [h.grad.copy() for h in holders]
    forward_and_backward(holders[0], targ, *holders[1:])
    for name, h, g in zip(NAMES, holders, first): np.testing.assert_array_equal(h.grad, g, err_msg=name)


@pytest.mark.parametrize("call, message", [
    (lambda: lin(np.ones((2, 3)), np.ones((4, 5)), np.zeros(5)), "lin: x has 3 features but w expects 4"),
    (lambda: lin(np.ones((2, 3)), np.ones((4, 5)), np.zeros(5)),
     "the last axis of x (2, 3) must match the first axis of w (4, 5)"),
    (lambda: lin(np.ones((2, 3)), np.ones((3, 5)), np.zeros((2, 5))), "lin: b must have shape (5,)"),
    (lambda: lin(np.ones((2, 3)), np.ones(3), np.zeros(1)), "lin: w must be a 2-d (in, out) array"),
    (lambda: column_mse(np.ones((3, 1)), np.ones((3, 1))), "column_mse: targ must have shape (3,)"),
    (lambda: column_mse(np.ones(3), np.ones(3)), "column_mse: out must have shape (n, 1), got (3,)"),
    (lambda: column_mse(np.ones((3, 2)), np.ones(3)), "column_mse: out must have shape (n, 1), got (3, 2)"),
    (lambda: mse_grad(GradHolder(np.ones((3, 1))), np.ones(4)), "mse_grad: targ must have shape (3,)"),
])
def test_shape_errors(call, message):
    with pytest.raises(ShapeError) as e: call()
    assert message in str(e.value)
    assert isinstance(e.value, FastADError)


def test_holder_errors():
    with pytest.raises(DifferentiationError, match="GradHolder: value must be an array, got list"): GradHolder([1., 2.])
    args, targ = problem(4, 3, 2, 2)
    holders = [GradHolder(a) for a in args]
    for i, name in enumerate(NAMES):
        bad = list(holders); bad[i] = args[i]
        with pytest.raises(DifferentiationError, match=f"forward_and_backward: {name} must be a GradHolder"):
            forward_and_backward(bad[0], targ, *bad[1:])


def test_strict_backend_runs_on_device_arrays(strict_backend):
    "Under the strict backend every exported function runs without host copies and returns StrictArrays."
    host, targ_host = problem(5, 6, 4, 3, dtype=np.float32)
    args, targ = [to_device(a) for a in host], to_device(targ_host)
    assert all(type(a) is StrictArray for a in args)
    z = normalize(args[0], args[0].mean(), args[0].std())
    h = plain_relu(lin(args[0], args[1], args[2]))
    out = model(*args)
    loss = column_mse(out, targ)
    for v in (z, h, out, loss): assert type(v) is StrictArray
    np.testing.assert_allclose(to_host(out), model(*host), rtol=1e-6)
    np.testing.assert_allclose(to_host(loss), column_mse(model(*host), targ_host), rtol=1e-6)
    holders = [GradHolder(a) for a in args]
    assert all(type(hd.grad) is StrictArray for hd in holders)
    loss2 = forward_and_backward(holders[0], targ, *holders[1:])
    assert type(loss2) is StrictArray
    reference = [GradHolder(a) for a in host]
    forward_and_backward(reference[0], targ_host, *reference[1:])
    for name, hd, ref in zip(NAMES, holders, reference):
        assert type(hd.grad) is StrictArray, name
        np.testing.assert_allclose(to_host(hd.grad), ref.grad, rtol=1e-5, atol=1e-6, err_msg=name)


def test_load_normalized_mnist(tmp_path, any_backend):
    "Normalized by the training statistics, labels as float32; offline (an empty cache) it uses the sample."
    x_train, y_train, x_valid, y_valid = load_normalized_mnist(path=tmp_path, download=False, verbose=False)
    assert x_train.shape[1] == x_valid.shape[1] == 784 and len(x_train) == len(y_train) and len(x_valid) == len(y_valid)
    for a in (x_train, y_train, x_valid, y_valid): assert a.dtype == np.float32
    assert abs(float(x_train.mean())) < 1e-3 and abs(float(x_train.std()) - 1) < 1e-3
    assert abs(float(x_valid.mean())) < 0.05 and abs(float(x_valid.std()) - 1) < 0.05
    assert float(y_train.min()) == 0 and float(y_train.max()) == 9
    if any_backend is not np:
        for a in (x_train, y_train, x_valid, y_valid): assert type(a) is not np.ndarray
