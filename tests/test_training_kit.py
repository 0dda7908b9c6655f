"""The training kit (fastad.training): learning-rate schedules taken by SGD, Adam and AdamW, AdamW's decoupled weight
decay, clipping by the global norm, saving and loading models without pickle, and the batch loader."""
import json, math, os, pickle
import numpy as np
import pytest
import fastad as fd
from fastad import layers
from fastad.errors import ArgumentError, DataError, DifferentiationError, ShapeError

def close(a, b, tol=1e-12): np.testing.assert_allclose(a, b, rtol=tol, atol=tol)

class W(fd.Differentiable):
    w: np.ndarray

# --- schedules --------------------------------------------------------------------------------------------
def test_constant_and_step_schedules_are_optaxs_and_pytorchs():
    assert [fd.constant_schedule(0.3)(s) for s in (0, 5, 10**6)] == [0.3] * 3
    s = fd.step_schedule(0.05, step_size=30)            # PyTorch's StepLR docs: 0.05 below 30, 0.005 below 60, 0.0005 below 90
    close([s(0), s(29), s(30), s(59), s(60), s(89)], [0.05, 0.05, 0.005, 0.005, 0.0005, 0.0005], 1e-15)
    s = fd.step_schedule(2.0, step_size=3, gamma=0.5)   # optax.exponential_decay(2.0, 3, 0.5, staircase=True)
    assert [s(k) for k in range(8)] == [2.0 * 0.5 ** (k // 3) for k in range(8)]
    assert s(np.int64(6)) == 0.5

def warmup_cosine_by_hand(step, init, peak, warmup, total, end):
    if step < warmup: return init + (peak - init) * step / warmup
    t = min(step - warmup, total - warmup)
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * t / (total - warmup)))

@pytest.mark.parametrize('init, peak, warmup, total, end', [(0.0, 1.0, 10, 110, 0.1), (0.01, 3e-4, 0, 50, 0.0), (1e-5, 1e-3, 7, 8, 1e-4)])
def test_warmup_cosine_is_optaxs_warmup_cosine_decay_schedule(init, peak, warmup, total, end):
    s = fd.warmup_cosine_schedule(peak, warmup_steps=warmup, total_steps=total, init_value=init, end_value=end)
    for step in range(total + 20): close(s(step), warmup_cosine_by_hand(step, init, peak, warmup, total, end), 1e-15)
    if warmup: close([s(0), s(warmup)], [init, peak], 1e-15)
    close(s(total), end, 1e-15)

def test_schedule_refusals():
    with pytest.raises(ArgumentError, match="step_schedule: gamma must be a finite number of 0 or more"): fd.step_schedule(0.1, 10, gamma=-1)
    with pytest.raises(ArgumentError, match="constant_schedule: value must be a finite"): fd.constant_schedule(float('nan'))
    with pytest.raises(ArgumentError, match=r"total_steps \(5\) counts the warm-up too"): fd.warmup_cosine_schedule(1.0, 5, 5)
    with pytest.raises(ArgumentError, match="peak_value must be above 0"): fd.warmup_cosine_schedule(0.0, 5, 10)
    with pytest.raises(ArgumentError, match="step must be a whole number of 0 or more, got 1.5"): fd.constant_schedule(1.0)(1.5)

# --- optimizers taking a schedule ---------------------------------------------------------------------------
GRADS = [np.array([0.5, -1.0]), np.array([0.1, 2.0]), np.array([-0.3, 0.4]), np.array([1.0, 1.0]), np.array([0.2, -0.7])]

def run(make, lrs_or_schedule, grads=GRADS):
    model = W(np.array([1.0, -2.0]))
    opt = make(model, lrs_or_schedule)
    for g in grads: opt.update(model, along=W(g))
    return model.w, opt

def run_with_rates(make, rates, grads=GRADS):
    "The library's optimizer, its learning rate set by hand before each step: what a schedule must do."
    model = W(np.array([1.0, -2.0]))
    opt = make(model, rates[0])
    for rate, g in zip(rates, grads): opt.learning_rate = rate; opt.update(model, along=W(g))
    return model.w

@pytest.mark.parametrize('name, make, plain', [
    ('SGD', lambda m, lr: fd.SGD(m, lr, momentum=0.9), lambda m, lr: layers.SGD(m, lr, momentum=0.9)),
    ('Adam', lambda m, lr: fd.Adam(m, lr), lambda m, lr: layers.Adam(m, lr)),
    ('AdamW', lambda m, lr: fd.AdamW(m, lr, weight_decay=0.0), lambda m, lr: layers.Adam(m, lr))])
def test_an_optimizer_given_a_schedule_uses_schedule_of_the_update_count(name, make, plain):
    schedule = fd.warmup_cosine_schedule(0.1, warmup_steps=2, total_steps=4, init_value=0.01, end_value=0.001)
    w, opt = run(make, schedule)
    close(w, run_with_rates(plain, [schedule(k) for k in range(len(GRADS))]), 0)
    assert opt.updates == len(GRADS) and opt.learning_rate == schedule(len(GRADS) - 1)
    w, _ = run(make, lambda step: 0.05 / (step + 1))                # any function of the step
    close(w, run_with_rates(plain, [0.05 / (k + 1) for k in range(len(GRADS))]), 0)

def test_with_a_number_sgd_and_adam_are_the_layers_chapters():
    assert issubclass(fd.SGD, layers.SGD) and issubclass(fd.Adam, layers.Adam) and issubclass(fd.AdamW, fd.Adam)
    close(run(lambda m, lr: fd.SGD(m, lr, momentum=0.5), 0.1)[0], run(lambda m, lr: layers.SGD(m, lr, momentum=0.5), 0.1)[0], 0)
    close(run(fd.Adam, 0.01)[0], run(layers.Adam, 0.01)[0], 0)

def test_a_refused_update_counts_no_step_and_moves_nothing():
    model = W(np.array([1.0, 2.0]))
    opt = fd.AdamW(model, fd.step_schedule(0.1, 1, 0.5), weight_decay=0.1)
    opt.update(model, along=W(np.array([1.0, 1.0])))
    before, state = model.w.copy(), (opt.updates, opt.steps, opt.m.w.copy(), opt.v.w.copy())
    with pytest.raises(ShapeError, match="nothing was changed"): opt.update(model, along=W(np.array([1.0, 1.0, 1.0])))
    assert (model.w == before).all() and (opt.updates, opt.steps) == state[:2] and (opt.m.w == state[2]).all() and (opt.v.w == state[3]).all()

def test_optimizer_refusals_name_the_optimizer():
    m = W(np.array([1.0]))
    with pytest.raises(ArgumentError, match="AdamW: learning_rate must be a positive number or a schedule"): fd.AdamW(m, -1.0)
    with pytest.raises(ArgumentError, match=r"AdamW: betas must be two numbers in \[0, 1\)"): fd.AdamW(m, betas=(1.0, 0.9))
    with pytest.raises(ArgumentError, match="AdamW: weight_decay must be a non-negative number"): fd.AdamW(m, weight_decay=-0.1)
    with pytest.raises(ArgumentError, match="SGD: model must be a Differentiable model"): fd.SGD([1.0], 0.1)
    with pytest.raises(ArgumentError, match="SGD: the learning-rate schedule gave inf for step 0"): fd.SGD(m, lambda step: float('inf'))
    opt = fd.SGD(m, lambda step: 0.5 if step == 0 else -1)
    opt.update(m, along=W(np.array([1.0])))
    with pytest.raises(ArgumentError, match="schedule gave -1 for step 1"): opt.update(m, along=W(np.array([1.0])))
    assert m.w == 0.5 and opt.updates == 1

@pytest.mark.parametrize('make, message', [
    (lambda m: fd.AdamW(m, weight_decay=math.inf), "AdamW: weight_decay must be a finite number, got inf"),
    (lambda m: fd.AdamW(m, eps=math.inf), "AdamW: eps must be a finite number, got inf"),
    (lambda m: fd.AdamW(m, eps=math.nan), "AdamW: eps must be a positive number, got nan"),
    (lambda m: fd.Adam(m, learning_rate=math.inf), "Adam: learning_rate must be"),
    (lambda m: fd.SGD(m, 0.1, momentum=math.inf), "SGD: momentum must be a finite number, got inf")])
def test_nonfinite_settings_are_refused_naming_the_optimizer(make, message):
    "inf as weight decay made the parameters -inf or NaN, as eps it silently took no step: refused when made."
    with pytest.raises(ArgumentError, match=message): make(W(np.array([1.0])))

# --- AdamW ------------------------------------------------------------------------------------------------
def adamw_by_hand(params, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-8):
    "torch.optim.AdamW's algorithm, written out: p *= 1 - lr*wd; then Adam's step."
    params = [p.copy() for p in params]
    m, v = [0 * p for p in params], [0 * p for p in params]
    for t, gs in enumerate(grads, start=1):
        for i, g in enumerate(gs):
            params[i] = params[i] * (1 - lr * wd)
            m[i], v[i] = b1 * m[i] + (1 - b1) * g, b2 * v[i] + (1 - b2) * g * g
            params[i] = params[i] - lr / (1 - b1 ** t) * m[i] / (np.sqrt(v[i]) / math.sqrt(1 - b2 ** t) + eps)
    return params

def test_adamw_is_pytorchs_formula_over_several_steps():
    rng = np.random.default_rng(0)
    w0, b0 = rng.normal(size=(3, 2)), rng.normal(size=2)
    grads = [(rng.normal(size=(3, 2)), rng.normal(size=2)) for _ in range(6)]
    dense = fd.Dense(weight=w0.copy(), bias=b0.copy())
    opt = fd.AdamW(dense, learning_rate=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.3)
    for gw, gb in grads: opt.update(dense, along=fd.Dense(weight=gw, bias=gb))
    want = adamw_by_hand([w0, b0], grads, 0.05, 0.3, 0.8, 0.99, 1e-6)
    close(dense.weight, want[0]); close(dense.bias, want[1])

def test_adamw_with_no_decay_is_adam_exactly_and_float32_stays_float32():
    def trained(make):
        net = fd.Sequential([fd.Dense(3, 4, activation=fd.relu, rng=np.random.default_rng(0)), fd.Dense(4, 1, rng=np.random.default_rng(1))])
        opt, x = make(net), np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
        for _ in range(4): opt.update(net, along=fd.gradient(lambda n: (n(x) ** 2).mean(), net))
        return net
    a, b = trained(lambda n: fd.Adam(n, 0.01)), trained(lambda n: fd.AdamW(n, 0.01, weight_decay=0))
    for x, y in zip(fd.tree.flatten(a)[0], fd.tree.flatten(b)[0]): assert (x == y).all()
    c = trained(lambda n: fd.AdamW(n, 0.01, weight_decay=0.5))
    assert all(l.dtype == np.float32 for l in fd.tree.flatten(c)[0])
    assert not (c.layers[1].weight == a.layers[1].weight).all()

def test_adamw_decays_a_tied_layer_once():
    dense = fd.Dense(weight=np.array([[2.0]]), bias=np.array([0.5]))
    net = fd.Sequential([dense, dense])
    g1, g2 = fd.Dense(weight=np.array([[0.3]]), bias=np.array([0.1])), fd.Dense(weight=np.array([[-0.1]]), bias=np.array([0.4]))
    opt = fd.AdamW(net, 0.1, weight_decay=0.2)
    opt.update(net, along=fd.Sequential([g1, g2]))
    want = adamw_by_hand([np.array([[2.0]]), np.array([0.5])], [(np.array([[0.2]]), np.array([0.5]))], 0.1, 0.2)
    close(dense.weight, want[0]); close(dense.bias, want[1])

# --- clipping ---------------------------------------------------------------------------------------------
def test_clip_by_global_norm_is_optaxs_and_pytorchs():
    rng = np.random.default_rng(0)
    tree = {'a': rng.normal(size=(3, 4)), 'b': [rng.normal(size=5), (rng.normal(size=()),)]}
    leaves = fd.tree.flatten(tree)[0]
    norm = math.sqrt(sum((l ** 2).sum() for l in leaves))
    close(fd.global_norm(tree), norm)
    for max_norm in (0.5 * norm, 2 * norm):
        clipped = fd.clip_by_global_norm(tree, max_norm)
        for got, leaf in zip(fd.tree.flatten(clipped)[0], leaves): close(got, leaf * max_norm / max(norm, max_norm))
        close(fd.global_norm(clipped), min(norm, max_norm))
    assert isinstance(clipped['b'][1], tuple) and (fd.tree.flatten(tree)[0][0] == leaves[0]).all()

def test_clipping_keeps_the_structure_and_dtypes():
    net = fd.Sequential([fd.Dense(weight=np.full((2, 2), 3.0, np.float32), bias=np.zeros(2, np.float32))])
    clipped = fd.clip_by_global_norm(net, 1.0)
    assert type(clipped) is fd.Sequential and type(clipped.layers[0]) is fd.Dense and clipped.layers[0].weight.dtype == np.float32
    close(clipped.layers[0].weight, np.full((2, 2), 0.5), 1e-7)
    mixed = fd.clip_by_global_norm([3.0, np.float32(4.0), np.array([0.0], np.float16)], 1.0)
    assert type(mixed[0]) is float and type(mixed[1]) is np.float32 and mixed[2].dtype == np.float16
    close(mixed[:2], [0.6, 0.8], 1e-7)
    assert fd.global_norm([]) == 0.0 and fd.clip_by_global_norm([], 1.0) == []

def test_a_nonfinite_gradient_clips_as_in_optax_and_pytorch():
    with np.errstate(invalid='ignore'):
        out = fd.clip_by_global_norm([np.array([np.inf, 1.0]), np.array([2.0])], 1.0)   # scaled by 1 / inf: [nan, 0], [0]
        assert np.isnan(out[0][0]) and out[0][1] == 0 and out[1][0] == 0
        assert np.isnan(fd.clip_by_global_norm([np.array([np.nan, 1.0])], 1.0)[0]).all()

def test_clipping_to_an_infinite_norm_leaves_the_gradient_as_pytorch_does():
    g = [np.ones(3) * 10]
    assert fd.clip_by_global_norm(g, math.inf) is g and (g[0] == 10).all()     # was NaN: 10 * inf / inf

def test_a_float16_gradient_has_its_norm_summed_in_float32():
    "300 ** 2 overflows float16 (largest 65504): the norm was inf and the clipped gradient zeros; PyTorch gives 300."
    g = [np.array([300., 1.], np.float16)]
    norm = fd.global_norm(g)
    assert np.isfinite(norm) and abs(norm - 300.0017) < 1e-3
    out = fd.clip_by_global_norm(g, 1.0)[0]
    assert out.dtype == np.float16 and abs(out[0] - 1) < 1e-3 and abs(out[1] - 1 / 300) < 1e-5

def test_clip_refusals():
    with pytest.raises(ArgumentError, match="clip_by_global_norm: max_norm must be a positive number"): fd.clip_by_global_norm([1.0], -1)
    with pytest.raises(ArgumentError, match="clip_by_global_norm: max_norm"): fd.clip_by_global_norm([1.0], '1')

# --- save and load ----------------------------------------------------------------------------------------
def cnn(seed=0, strides=(1, 1), size=4):
    rng = np.random.default_rng(seed)
    return fd.Sequential([fd.Conv2D((3, 3, 1, size), strides=strides, padding='same', activation=fd.relu, rng=rng), fd.MaxPool2D(),
                          fd.Flatten(), fd.Dense(size * 4, 8, rng=rng), fd.LayerNorm(8), fd.Dropout(0.1, rng=rng), fd.Dense(8, 3, rng=rng)])

def leaves(x): return fd.tree.flatten(x, static_ok=True)[0]

def test_a_sequential_of_many_layers_round_trips(tmp_path):
    net, path = cnn(0), tmp_path / 'net.npz'
    fd.save(net, path)
    back = fd.load(path, like=fd.set_training(cnn(1), False))
    assert [type(l) for l in back.layers] == [type(l) for l in net.layers]
    for a, b in zip(leaves(back), leaves(net)): assert a.dtype == b.dtype and (a == b).all()
    x = np.random.default_rng(2).normal(size=(2, 4, 4, 1)).astype(np.float32)
    fd.set_training(net, False)
    assert (back(x) == net(x)).all() and back.layers[0].strides == (1, 1) and not back.layers[5].training
    assert os.listdir(tmp_path) == ['net.npz']                   # written whole: nothing left over

def test_an_embedding_model_and_nested_dicts_and_lists_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tree = {'emb': fd.Embedding(7, 3, rng=rng), 'stack': [fd.Dense(3, 2, rng=rng), (np.arange(3.), 2.5)],
            3: {'scale': np.float32(0.5), 'steps': 10, 'name': 'x'}}
    fd.save(tree, str(tmp_path / 'tree.npz'))
    like = {'emb': fd.Embedding(7, 3), 'stack': [fd.Dense(3, 2), (np.zeros(3), 0.0)], 3: {'name': 'x', 'scale': np.float32(0), 'steps': 10}}
    back = fd.load(tmp_path / 'tree.npz', like=like)
    assert (back['emb'].weight == tree['emb'].weight).all() and (back['stack'][0].bias == tree['stack'][0].bias).all()
    assert back['stack'][1][1] == 2.5 and type(back['stack'][1][1]) is float and isinstance(back['stack'][1], tuple)
    assert back[3]['scale'] == np.float32(0.5) and type(back[3]['scale']) is np.float32 and list(back[3]) == ['name', 'scale', 'steps']
    assert like['emb'].weight.std() != tree['emb'].weight.std()             # like= itself is left as it was

def test_a_tied_layer_stays_one_layer(tmp_path):
    d = fd.Dense(2, 2)
    fd.save(fd.Sequential([d, d]), tmp_path / 't.npz')
    e = fd.Dense(2, 2)
    back = fd.load(tmp_path / 't.npz', like=fd.Sequential([e, e]))
    assert back.layers[0] is back.layers[1] and (back.layers[0].weight == d.weight).all()
    with np.load(tmp_path / 't.npz') as f: assert len(f.files) == 3                # its arrays once
    with pytest.raises(DataError, match=r"model.layers\[1\] is the same layer as model.layers\[0\] in the file, but not in like="):
        fd.load(tmp_path / 't.npz', like=fd.Sequential([fd.Dense(2, 2), fd.Dense(2, 2)]))

class Net(fd.Layer):
    first: fd.Dense
    second: fd.Dense
    def forward(self, x): return self.second(self.first(x))

class Other(fd.Layer):
    first: fd.Dense
    last: fd.Dense
    def forward(self, x): return self.last(self.first(x))

@pytest.mark.parametrize('like, message', [
    (lambda: Net(fd.Dense(2, 3), fd.Dense(3, 4)), r"model.second.weight has shape \(3, 1\) in the file, but \(3, 4\) in like="),
    (lambda: Net(fd.Dense(2, 3), fd.Dense(weight=np.ones((3, 1)), bias=np.ones(1))), r"model.second.weight is float32 in the file, but float64 in like="),
    (lambda: Other(fd.Dense(2, 3), fd.Dense(3, 1)), r"model is a Net in the file, but a Other in like="),
    (lambda: Net(fd.Dense(2, 3, activation=fd.relu), fd.Dense(3, 1)), r"model.first.activation is null in the file, but .*relu"),
    (lambda: Net(fd.Sequential([fd.Dense(2, 3)]), fd.Dense(3, 1)), r"model.first is a Dense in the file, but a Sequential in like="),
    (lambda: [fd.Dense(2, 3)], r"model is a list in like=, but a fields in the file"),
])
def test_a_file_of_another_structure_is_refused_naming_what_differs(tmp_path, like, message):
    fd.save(Net(fd.Dense(2, 3), fd.Dense(3, 1)), tmp_path / 'n.npz')
    with pytest.raises(DataError, match=message): fd.load(tmp_path / 'n.npz', like=like())

def test_renamed_fields_list_lengths_dict_keys_and_settings_are_refused(tmp_path):
    class Renamed(fd.Layer):
        first: fd.Dense
        third: fd.Dense
    Renamed.__qualname__ = 'Net'
    fd.save(Net(fd.Dense(2, 3), fd.Dense(3, 1)), tmp_path / 'n.npz')
    with pytest.raises(DataError, match=r"has the fields \['first', 'second'\] in the file, but \['first', 'third'\]"):
        fd.load(tmp_path / 'n.npz', like=Renamed(fd.Dense(2, 3), fd.Dense(3, 1)))
    fd.save([np.ones(2), np.ones(2)], tmp_path / 'l.npz')
    with pytest.raises(DataError, match="model has 2 items in the file, but 3 in like="): fd.load(tmp_path / 'l.npz', like=[np.ones(2)] * 3)
    fd.save({'a': np.ones(2)}, tmp_path / 'd.npz')
    with pytest.raises(DataError, match="has the keys"): fd.load(tmp_path / 'd.npz', like={'b': np.ones(2)})
    fd.save(cnn(0), tmp_path / 'c.npz')
    with pytest.raises(DataError, match=r"model.layers\[0\].strides is .*\[1, 1\].* in the file, but .*\[2, 2\]"):
        fd.load(tmp_path / 'c.npz', like=cnn(0, strides=(2, 2)))

def rewrite(path, **entries):
    with np.load(path, allow_pickle=False) as f: old = {k: f[k] for k in f.files}
    old.update(entries)
    np.savez(path, **{k: v for k, v in old.items() if v is not None})

def test_a_tampered_file_is_refused(tmp_path):
    path, net = tmp_path / 'n.npz', Net(fd.Dense(2, 3), fd.Dense(3, 1))
    fd.save(net, path)
    rewrite(path, leaf_1=np.zeros(4, np.float32))
    with pytest.raises(DataError, match=r"was changed after it was written: leaf_1 is float32 of shape \(4,\), but its description says float32 of shape \(3,\)"):
        fd.load(path, like=net)
    fd.save(net, path); rewrite(path, leaf_0=np.zeros((2, 3)))
    with pytest.raises(DataError, match="leaf_0 is float64"): fd.load(path, like=net)
    fd.save(net, path); rewrite(path, leaf_3=None)
    with pytest.raises(DataError, match=r"holds the arrays \['leaf_0', 'leaf_1', 'leaf_2'\], but its description names"): fd.load(path, like=net)
    fd.save(net, path); rewrite(path, extra=np.ones(1))
    with pytest.raises(DataError, match="holds the arrays"): fd.load(path, like=net)
    fd.save(net, path); rewrite(path, structure=np.array('{"format": "fastad.save/1", "model": {"leaf": "x"}}'))
    with pytest.raises(DataError, match="a description fastad cannot read"): fd.load(path, like=net)
    fd.save(net, path); rewrite(path, structure=np.array('not json'))
    with pytest.raises(DataError, match="a description fastad cannot read"): fd.load(path, like=net)
    fd.save(net, path); rewrite(path, structure=None)
    with pytest.raises(DataError, match="has no description of its structure"): fd.load(path, like=net)

def test_a_deeply_nested_description_is_a_data_error_naming_the_file(tmp_path):
    "json.loads of 100,000 nested lists raised a bare RecursionError."
    path, net = tmp_path / 'n.npz', Net(fd.Dense(2, 3), fd.Dense(3, 1))
    fd.save(net, path); rewrite(path, structure=np.array('[' * 100_000 + ']' * 100_000))
    with pytest.raises(DataError, match=r"n.npz has a description nested too deeply"): fd.load(path, like=net)
    deep = '{"format": "fastad.save/1", "model": ' + '{"list": [' * 20_000 + ']}' * 20_000 + '}'
    fd.save(net, path); rewrite(path, structure=np.array(deep))
    with pytest.raises(DataError, match="n.npz has a description nested too deeply"): fd.load(path, like=net)

def test_a_dropout_saved_with_a_generator_loads_into_one_without(tmp_path):
    "The generator is like='s, as the training mode is: it was compared as structure and refused."
    net = fd.Sequential([fd.Dense(2, 3), fd.Dropout(0.1, rng=np.random.default_rng(0))])
    fd.save(net, tmp_path / 'd.npz')
    back = fd.load(tmp_path / 'd.npz', like=fd.Sequential([fd.Dense(2, 3), fd.Dropout(0.1)]))
    assert back.layers[1].rng is None and (back.layers[0].weight == net.layers[0].weight).all()
    rng = np.random.default_rng(5)
    fd.save(fd.Dropout(0.1), tmp_path / 'e.npz')
    assert fd.load(tmp_path / 'e.npz', like=fd.Dropout(0.1, rng=rng)).rng is rng
    with pytest.raises(DataError, match="model.p is 0.1 in the file, but 0.2"): fd.load(tmp_path / 'e.npz', like=fd.Dropout(0.2))

class Boom:
    "Unpickling one would write a file: loading must never get that far."
    def __reduce__(self): return (open, (os.environ['BOOM_PATH'], 'w'))

def test_loading_never_unpickles(tmp_path, monkeypatch):
    monkeypatch.setenv('BOOM_PATH', str(tmp_path / 'boom'))
    path, net = tmp_path / 'n.npz', Net(fd.Dense(2, 3), fd.Dense(3, 1))
    fd.save(net, path)
    with np.load(path) as f: old = {k: f[k] for k in f.files}
    np.savez(path, **{**old, 'leaf_0': np.array([Boom()], dtype=object)}, allow_pickle=True)
    with pytest.raises(DataError, match="cannot be read"): fd.load(path, like=net)
    (tmp_path / 'p.npz').write_bytes(pickle.dumps(Boom()))
    with pytest.raises(DataError, match="cannot be read") as refused: fd.load(tmp_path / 'p.npz', like=net)
    assert 'allow_pickle' not in str(refused.value) and 'never loads' in str(refused.value)   # not NumPy's hint
    np.save(tmp_path / 'a.npy', np.ones(3))
    with pytest.raises(DataError, match="cannot be read"): fd.load(tmp_path / 'a.npy', like=net)
    assert not (tmp_path / 'boom').exists()

def test_save_and_load_refusals(tmp_path):
    with pytest.raises(ArgumentError, match="load: pass like="): fd.load(tmp_path / 'x.npz')
    with pytest.raises(FileNotFoundError): fd.load(tmp_path / 'missing.npz', like=[np.ones(1)])
    with pytest.raises(ArgumentError, match="save: model.w is a traced value"):
        fd.gradient(lambda m: (fd.save(m, tmp_path / 'x.npz'), m.w.sum())[1], W(np.ones(2)))
    class Bad(fd.Layer):
        def __init__(self): self.weight = np.ones(2)
    with pytest.raises(DifferentiationError, match="save: model.weight"): fd.save(Bad(), tmp_path / 'x.npz')

# --- batches ----------------------------------------------------------------------------------------------
X, Y = np.arange(22.).reshape(11, 2), np.arange(11)

@pytest.mark.parametrize('drop_last, sizes', [(False, [4, 4, 3]), (True, [4, 4])])
def test_batch_sizes_and_drop_last(drop_last, sizes):
    loader = fd.batches((X, Y), 4, rng=np.random.default_rng(0), drop_last=drop_last)
    assert len(loader) == len(sizes) and [len(y) for _, y in loader] == sizes
    assert [len(y) for y in fd.batches(Y, 11, drop_last=drop_last)] == [11]
    assert list(fd.batches(Y, 12, drop_last=True)) == [] and len(fd.batches(Y, 12)) == 1

def test_shuffled_batches_are_a_permutation_from_the_generator_and_rows_stay_together():
    epoch = list(fd.batches((X, Y), 4, rng=np.random.default_rng(5)))
    order = np.random.default_rng(5).permutation(11)
    assert (np.concatenate([y for _, y in epoch]) == order).all()
    assert all((x[:, 0] == 2 * y).all() for x, y in epoch)
    again = [y for _, y in fd.batches((X, Y), 4, rng=np.random.default_rng(5))]
    assert all((a == b).all() for a, b in zip(again, [y for _, y in epoch]))

def test_each_pass_draws_a_new_order_and_no_shuffle_keeps_the_order():
    loader = fd.batches(Y, 11, rng=np.random.default_rng(1))
    first, second = next(iter(loader)), next(iter(loader))
    assert sorted(first) == sorted(second) == list(range(11)) and (first != second).any()
    assert [list(b) for b in fd.batches(Y, 5, shuffle=False)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10]]
    fd.backend.manual_seed(4); a = [list(b) for b in fd.batches(Y, 4)]
    fd.backend.manual_seed(4); b = [list(b) for b in fd.batches(Y, 4)]
    assert a == b

def test_batches_of_dicts_and_lists_and_a_progress_bar(monkeypatch, capsys):
    monkeypatch.setenv('FASTAD_PROGRESS', '1')                  # quiet under tests unless asked for
    out = list(fd.batches({'x': X, 'y': [Y, Y * 2]}, 6, shuffle=False, progress=True))
    assert 'batches' in capsys.readouterr().err                 # the bar was drawn, named
    assert list(out[0]) == ['x', 'y'] and isinstance(out[0]['y'], list) and (out[1]['y'][1] == [12, 14, 16, 18, 20]).all()

def test_batches_refusals():
    with pytest.raises(ShapeError, match=r"the arrays have \[11, 10\] rows"): fd.batches((X, Y[:10]), 2)
    with pytest.raises(ArgumentError, match="batch_size must be a whole number of 1 or more"): fd.batches(X, 0)
    with pytest.raises(ArgumentError, match="arrays must be arrays with one example per row"): fd.batches([1, 2, 3], 2)
    with pytest.raises(ArgumentError, match="rng must be a random generator"): fd.batches(X, 2, rng=0)
    with pytest.raises(ArgumentError, match="drop_last must be True or False"): fd.batches(X, 2, drop_last=None)

def test_on_a_device_backend_arrays_stay_on_the_device(tmp_path):
    from fastad import strict
    from fastad.backend import array_module, asarray, to_host
    with fd.use_backend('strict'):
        net = fd.Sequential([fd.Dense(3, 2, rng=np.random.default_rng(0)), fd.LayerNorm(2)])
        fd.save(net, tmp_path / 'n.npz')
        back = fd.load(tmp_path / 'n.npz', like=fd.Sequential([fd.Dense(3, 2), fd.LayerNorm(2)]))
        assert all(array_module(l) is strict for l in leaves(back))
        assert (to_host(back.layers[0].weight) == to_host(net.layers[0].weight)).all()
        clipped = fd.clip_by_global_norm(net, 0.1)
        assert array_module(clipped.layers[0].weight) is strict
        close(to_host(fd.global_norm(clipped)), 0.1, 1e-6)
        x = asarray(np.arange(12.).reshape(6, 2))
        parts = list(fd.batches(x, 4, rng=np.random.default_rng(0)))
        assert all(array_module(p) is strict for p in parts) and sorted(np.concatenate([to_host(p)[:, 0] for p in parts])) == list(range(0, 12, 2))
        opt = fd.AdamW(net, fd.constant_schedule(0.01))
        opt.update(net, along=fd.gradient(lambda n: (n(x[:, :1] @ asarray(np.ones((1, 3)))) ** 2).sum(), net))
        assert array_module(net.layers[0].weight) is strict

# --- under fd.jit -----------------------------------------------------------------------------------------
def jit_step(model, opt, x, y):
    value, grad = fd.value_with_gradient(lambda m, x, y: fd.mse(m(x), y), model, x, y, argnums=0)
    opt.update(model, along=fd.clip_by_global_norm(grad, 1.0))
    return value

def small_net(seed=0):
    r = np.random.default_rng(seed)
    return fd.Sequential([fd.Dense(weight=r.normal(size=(3, 5)), bias=np.zeros(5), activation=fd.relu), fd.LayerNorm(weight=np.ones(5), bias=np.zeros(5)),
                          fd.Dense(weight=r.normal(size=(5, 1)), bias=np.zeros(1))])

@pytest.mark.parametrize('make', [lambda m: fd.SGD(m, 0.1, momentum=0.9), lambda m: fd.AdamW(m, 0.01, weight_decay=0.1)], ids=['sgd', 'adamw'])
def test_with_a_number_the_optimizers_and_clipping_run_under_jit_as_eager(make):
    x, y = np.random.default_rng(1).normal(size=(6, 3)), np.ones((6, 1))
    a, b = small_net(), small_net()
    oa, ob, step = make(a), make(b), fd.jit(jit_step)
    for _ in range(4): close(step(b, ob, x, y), jit_step(a, oa, x, y), 1e-12)
    for p, q in zip(leaves(a), leaves(b)): close(p, q, 1e-12)
    assert oa.updates == ob.updates == 4

@pytest.mark.parametrize('schedule', [lambda: fd.step_schedule(0.01, 2), lambda: fd.warmup_cosine_schedule(0.01, 2, 6)], ids=['step', 'cosine'])
def test_a_schedule_runs_under_jit_as_eagerly(schedule):
    "The traced update count goes through the schedule as NumPy arithmetic: the same rates and models as eager, one program."
    eager, traced = small_net(), small_net()
    eager_opt, traced_opt = fd.AdamW(eager, schedule()), fd.AdamW(traced, schedule())
    fast, rng = fd.jit(jit_step), np.random.default_rng(0)
    for _ in range(8):
        x, y = rng.normal(size=(4, 3)), rng.normal(size=(4, 1))
        np.testing.assert_allclose(fast(traced, traced_opt, x, y), jit_step(eager, eager_opt, x, y), rtol=1e-12)
        assert abs(traced_opt.learning_rate - eager_opt.learning_rate) <= 1e-15
    for p, q in zip(fd.tree.flatten(eager)[0], fd.tree.flatten(traced)[0]): np.testing.assert_allclose(q, p, rtol=1e-12, atol=1e-15)
    assert len(fast.programs) == 1


# --- against PyTorch itself (skipped where it is not installed) -----------------------------------------------
def test_adamw_over_steps_is_torch_optim_adamw():
    torch = pytest.importorskip('torch')
    rng = np.random.default_rng(4)
    start, grads = rng.normal(size=(3, 2)), [rng.normal(size=(3, 2)) * 10 ** (k % 3 - 1) for k in range(12)]
    p = torch.tensor(start, requires_grad=True)
    opt_t = torch.optim.AdamW([p], lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.3)
    m = W(start.copy()); opt = fd.AdamW(m, 0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.3)
    for g in grads:
        p.grad = torch.tensor(g); opt_t.step()
        opt.update(m, W(g))
    close(m.w, p.detach().numpy(), 1e-12)

@pytest.mark.parametrize('grads, max_norm', [
    ([np.array([3.0, -4.0]), np.array([[12.0]])], 1.0),        # clipped: norm 13
    ([np.array([0.1, 0.2]), np.array([[0.2]])], 1.0),          # within the limit
    ([np.zeros(2), np.zeros((1, 1))], 1.0),                    # a zero norm
    ([np.array([3.0, -4.0]), np.array([[12.0]])], math.inf),   # no limit
    ([np.array([np.inf, 1.0]), np.array([[2.0]])], 1.0)])      # an infinite norm: NaN and zeros
def test_clipping_is_torchs_clip_grad_norm(grads, max_norm):
    torch = pytest.importorskip('torch')
    params = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for p, g in zip(params, grads): p.grad = torch.tensor(g)
    with np.errstate(invalid='ignore'):
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        ours = fd.clip_by_global_norm(grads, max_norm)
        assert fd.global_norm(grads) == norm.item() or (np.isinf(norm.item()) and np.isinf(fd.global_norm(grads)))
    for o, p in zip(ours, params):                          # PyTorch adds 1e-6 to the norm; we don't
        np.testing.assert_allclose(o, p.grad.numpy(), rtol=1e-6, atol=1e-12, equal_nan=True)
