"LayerNorm, Dropout and Embedding (fastad.more_layers): PyTorch's definitions, differentiated by fastad's engine, inside fd.Sequential."
import numpy as np
import pytest
import fastad as fd
from fastad.errors import ArgumentError, ShapeError
from fastad.testing import numerical_gradient

def close(a, b, tol=1e-7): np.testing.assert_allclose(a, b, rtol=tol, atol=tol)

def layer_norm_by_hand(x, weight, bias, k, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias

# --- LayerNorm --------------------------------------------------------------------------------------------
@pytest.mark.parametrize('features', [5, (3, 5)])
def test_layer_norm_is_pytorchs_formula(features):
    rng = np.random.default_rng(0)
    x = rng.normal(3, 2, size=(2, 3, 5))
    k = 1 if isinstance(features, int) else len(features)
    shape = x.shape[-k:]
    w, b = rng.normal(size=shape), rng.normal(size=shape)
    close(fd.LayerNorm(weight=w, bias=b)(x), layer_norm_by_hand(x, w, b, k), 1e-12)
    fresh = fd.LayerNorm(features)
    assert fresh.weight.shape == shape and fresh.weight.dtype == np.float32 and (fresh.weight == 1).all() and (fresh.bias == 0).all()
    y = fresh(x.astype(np.float32))
    assert y.dtype == np.float32
    close(y, layer_norm_by_hand(x, 1, 0, k), 1e-5)

def test_layer_norm_matches_pytorchs_published_numbers_and_eps():
    y = fd.LayerNorm(3)(np.array([[1., 2., 4.]]))       # torch.nn.LayerNorm(3)(torch.tensor([[1., 2., 4.]]))
    close(y, [[-1.0690, -0.2673, 1.3363]], 1e-4)
    assert fd.LayerNorm(3).eps == 1e-5
    close(fd.LayerNorm(1, eps=1.0)(np.array([[2.0]])), [[0.0]])
    x = np.array([[1.0, 3.0]])                          # variance 1: with eps=1, each entry / sqrt(2)
    close(fd.LayerNorm(2, eps=1.0)(x), [[-1 / np.sqrt(2), 1 / np.sqrt(2)]], 1e-12)

def test_layer_norm_gradients_agree_with_central_differences():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 2, 4))
    net = fd.LayerNorm(weight=rng.normal(size=(2, 4)), bias=rng.normal(size=(2, 4)))
    f = lambda net, x: (np.sin(net(x)) * np.arange(8.).reshape(2, 4)).sum()
    got, want = fd.gradient(f, net, x), numerical_gradient(f, net, x)
    close(got[0].weight, want[0].weight, 1e-6); close(got[0].bias, want[0].bias, 1e-6); close(got[1], want[1], 1e-6)

def test_layer_norm_refusals():
    with pytest.raises(ShapeError, match=r"LayerNorm\(\(4,\)\): the input has shape \(2, 3\)"): fd.LayerNorm(4)(np.ones((2, 3)))
    with pytest.raises(ArgumentError, match="features must be the size of the last axis"): fd.LayerNorm(0)
    with pytest.raises(ArgumentError, match="features must be the size of the last axis"): fd.LayerNorm(2.0)
    with pytest.raises(ArgumentError, match="not a mix"): fd.LayerNorm(3, weight=np.ones(3))
    with pytest.raises(ShapeError, match="weight and bias must have the shape"): fd.LayerNorm(weight=np.ones(3), bias=np.ones(2))
    for eps in (0, -1e-5, float('inf'), float('nan')):
        with pytest.raises(ArgumentError, match="eps must be a positive finite number"): fd.LayerNorm(3, eps=eps)

# --- Dropout ----------------------------------------------------------------------------------------------
def test_dropout_is_inverted_dropout_drawn_from_its_generator():
    x = np.full((400, 100), 2.0, np.float32)
    y = fd.Dropout(0.3, rng=np.random.default_rng(5))(x)
    assert y.dtype == np.float32 and abs((y == 0).mean() - 0.3) < 0.01
    close(np.unique(y), [0.0, np.float32(2 / 0.7)], 1e-6)
    keep = np.random.default_rng(5).random(x.shape, dtype=np.float32) >= 0.3     # the mask, drawn the same way
    close(y, np.where(keep, x / 0.7, 0), 1e-6)

def test_dropout_modes_and_edges():
    x = np.arange(6.).reshape(2, 3)
    d = fd.Dropout(0.5, rng=np.random.default_rng(0))
    assert d.training and d.eval() is d and not d.training and d(x) is x
    assert d.train() is d and d.training
    assert fd.Dropout(0.0)(x) is x and (fd.Dropout(1.0)(x) == 0).all()
    assert fd.Dropout(0.5, training=False)(x) is x

def test_dropout_without_a_generator_draws_from_fastads_which_manual_seed_reseeds():
    x = np.ones((20, 20))
    fd.backend.manual_seed(3); a = fd.Dropout(0.5)(x)
    fd.backend.manual_seed(3); b = fd.Dropout(0.5)(x)
    assert (a == b).all() and (a == 0).any()

def test_the_shared_generator_is_made_once_not_at_every_call(monkeypatch):
    "Dropout without an rng and an unseeded batch loader built a new generator (seeded from the OS) at every call."
    from fastad import backend
    monkeypatch.setattr(backend, 'generators', {})
    made = []
    real = backend.default_rng
    monkeypatch.setattr(backend, 'default_rng', lambda *a: made.append(1) or real(*a))
    for _ in range(3): fd.Dropout(0.5)(np.ones(4)); list(fd.batches(np.arange(6), 2))
    assert len(made) == 1

def test_dropout_gradient_is_the_mask_scaled():
    x = np.random.default_rng(2).normal(size=(6, 7))
    g = fd.gradient(lambda x: (fd.Dropout(0.25, rng=np.random.default_rng(9))(x) * x).sum(), x)
    keep = np.random.default_rng(9).random(x.shape, dtype=np.float32) >= 0.25
    close(g, np.where(keep, 2 * x / 0.75, 0), 1e-12)

def test_a_checkpointed_dropout_replays_its_mask_from_the_generator_it_is_given():
    def gradient(discarding):
        rng = np.random.default_rng(11)
        inner = fd.Sequential([fd.Dense(4, 6, activation=fd.relu, rng=np.random.default_rng(0)), fd.Dropout(0.5, rng=rng)])
        net = fd.Sequential([inner.discarding_activations(generators=(rng,)) if discarding else inner, fd.Dense(6, 1, rng=np.random.default_rng(1))])
        return fd.gradient(lambda net: (net(np.ones((8, 4), np.float32)) ** 2).sum(), net)
    plain, recomputed = gradient(False), gradient(True)
    close(recomputed.layers[0].wrapped.layers[0].weight, plain.layers[0].layers[0].weight, 0)
    close(recomputed.layers[1].weight, plain.layers[1].weight, 0)

def test_set_training_switches_every_dropout_inside_a_model():
    inner = fd.Dropout(0.1)
    net = fd.Sequential([fd.Dense(2, 2), fd.Sequential([inner]), fd.Dropout(0.2)])
    assert fd.set_training(net, False) is net and not inner.training and not net.layers[2].training
    fd.set_training({'a': [net]}, True)
    assert inner.training and net.layers[2].training
    with pytest.raises(ArgumentError, match="training must be True or False"): fd.set_training(net, 0)

def test_dropout_refusals():
    with pytest.raises(ArgumentError, match=r"p, the probability of zeroing an entry, must be a number in \[0, 1\], got -0.1"): fd.Dropout(-0.1)
    with pytest.raises(ArgumentError, match="rng must be a random generator"): fd.Dropout(0.5, rng=3)
    for x in (np.arange(4), np.array([True, False]), 3):                # PyTorch refuses integer input too
        with pytest.raises(ArgumentError, match="Dropout: x must be floating point"): fd.Dropout(0.5)(x)

# --- Embedding --------------------------------------------------------------------------------------------
def test_embedding_looks_rows_up_and_starts_standard_normal():
    table = fd.Embedding(1000, 16, rng=np.random.default_rng(0))
    assert table.weight.shape == (1000, 16) and table.weight.dtype == np.float32
    assert abs(table.weight.mean()) < 0.02 and abs(table.weight.std() - 1) < 0.02
    ids = np.array([[3, 7, 3], [999, 0, 1]])
    out = table(ids)
    assert out.shape == (2, 3, 16) and (out[0, 0] == table.weight[3]).all() and (out[1, 0] == table.weight[999]).all()
    assert (table([1, 2]) == table.weight[[1, 2]]).all() and table(4).shape == (16,)
    a, b = fd.Embedding(5, 3, rng=np.random.default_rng(7)), fd.Embedding(5, 3, rng=np.random.default_rng(7))
    assert (a.weight == b.weight).all()

def test_embedding_gradient_scatter_adds_rows_and_repeats_add():
    table = fd.Embedding(weight=np.zeros((5, 2)))
    ids = np.array([[0, 4, 4], [4, 1, 0]])
    cot = np.arange(12.).reshape(2, 3, 2)
    g = fd.gradient(lambda t: (t(ids) * cot).sum(), table)
    want = np.zeros((5, 2))
    np.add.at(want, ids, cot)
    close(g.weight, want, 0)
    close(g.weight[4], cot[0, 1] + cot[0, 2] + cot[1, 0], 0)

def test_embedding_gradient_agrees_with_central_differences_inside_sequential():
    rng = np.random.default_rng(3)
    net = fd.Sequential([fd.Embedding(weight=rng.normal(size=(6, 4))), fd.LayerNorm(weight=rng.normal(size=4), bias=rng.normal(size=4)),
                         fd.Dense(weight=rng.normal(size=(4, 2)), bias=rng.normal(size=2), activation=np.tanh)])
    ids = np.array([[1, 5, 1], [2, 2, 0]])
    f = lambda net: (net(ids) ** 2).sum()
    got, want = fd.gradient(f, net), numerical_gradient(f, net)
    for a, b in zip(fd.tree.flatten(got)[0], fd.tree.flatten(want)[0]): close(a, b, 1e-6)

def test_embedding_refusals():
    table = fd.Embedding(4, 2)
    with pytest.raises(ArgumentError, match=r"indices holds index 4, which is outside the table's rows 0..3"): table(np.array([0, 4]))
    with pytest.raises(ArgumentError, match=r"index -1, which is outside"): table(np.array([-1]))
    with pytest.raises(ArgumentError, match="indices must be integers"): table(np.array([1.0]))
    with pytest.raises(ArgumentError, match="count must be a whole number"): fd.Embedding(0, 2)
    with pytest.raises(ShapeError, match=r"weight must be a \(count, size\) table"): fd.Embedding(weight=np.ones(3))
    with pytest.raises(ArgumentError, match="not both"): fd.Embedding(3, 2, weight=np.ones((3, 2)))

def test_on_a_device_backend_the_mask_and_the_indices_go_where_the_arrays_are():
    from fastad import strict
    from fastad.backend import array_module, asarray, to_host
    with fd.use_backend('strict'):
        table = fd.Embedding(5, 2, rng=np.random.default_rng(0))
        assert array_module(table.weight) is strict
        out = table(np.array([1, 1]))                                         # host ids, moved to the table's device
        assert array_module(out) is strict and (to_host(out) == to_host(table.weight)[[1, 1]]).all()
        g = fd.gradient(lambda t: t(np.array([1, 1, 4])).sum(), table)
        assert (to_host(g.weight)[:, 0] == [0, 2, 0, 0, 1]).all()
        y = fd.Dropout(0.5, rng=np.random.default_rng(0))(asarray(np.ones(8)))  # a host generator's mask, moved
        assert array_module(y) is strict
        z = fd.Dropout(0.5)(np.ones(8))                                       # the device's generator, on host data
        assert type(z) is np.ndarray
        for bad in (-1, 5):                                                   # was the last row, and a bare IndexError
            with pytest.raises(ArgumentError, match=f"Embedding: indices holds index {bad}"): table(asarray(np.array([bad])))
        norm = fd.LayerNorm(3)
        assert array_module(norm(asarray(np.arange(6.).reshape(2, 3)))) is strict


# --- against PyTorch itself (skipped where it is not installed) -----------------------------------------------
@pytest.mark.parametrize('features', [5, (3, 5)])
def test_layer_norm_and_its_gradients_are_torchs(features):
    torch = pytest.importorskip('torch')
    rng = np.random.default_rng(8)
    shape = (features,) if isinstance(features, int) else features
    x, w, b = rng.normal(size=(4,) + shape), rng.normal(size=shape), rng.normal(size=shape)
    upstream = rng.normal(size=(4,) + shape)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    yt = torch.nn.functional.layer_norm(xt, shape, wt, bt, eps=1e-5)
    (yt * torch.tensor(upstream)).sum().backward()
    f = lambda norm, x: (norm(x) * upstream).sum()
    norm = fd.LayerNorm(weight=w, bias=b)
    close(norm(x), yt.detach().numpy(), 1e-12)
    g_norm, g_x = fd.gradient(lambda n: f(n, x), norm), fd.gradient(lambda x: f(norm, x), x)
    close(g_norm.weight, wt.grad.numpy(), 1e-12); close(g_norm.bias, bt.grad.numpy(), 1e-12); close(g_x, xt.grad.numpy(), 1e-12)

def test_embedding_gradient_with_repeated_indices_is_torchs():
    torch = pytest.importorskip('torch')
    rng = np.random.default_rng(9)
    weight, ids, upstream = rng.normal(size=(6, 3)), np.array([[1, 4, 1], [1, 0, 4]]), rng.normal(size=(2, 3, 3))
    table_t = torch.nn.Embedding.from_pretrained(torch.tensor(weight), freeze=False)
    (table_t(torch.tensor(ids)) * torch.tensor(upstream)).sum().backward()
    g = fd.gradient(lambda t: (t(ids) * upstream).sum(), fd.Embedding(weight=weight))
    close(g.weight, table_t.weight.grad.numpy(), 1e-12)
