"""What a primitive's chains keep, declared where the rule is written (`keeps=`), and the locks the engine takes from it.

The engine locks the user's arrays that a pullback reads. A rule that declares `keeps` is trusted, with no look into
its closures; these tests hold every declaration against that look (`engine._keeps`, still used for custom rules)."""
import gc
import numpy as np
import pytest
import fastad as fd
from fastad import cnn, engine, primitives as P
from fastad.errors import DifferentiationError

rng = np.random.default_rng(0)
A, B = rng.uniform(0.5, 2, (3, 4)), rng.uniform(0.5, 2, (3, 4))
X, F, BIAS = rng.standard_normal((2, 6, 6, 3)), rng.standard_normal((3, 3, 3, 4)), rng.standard_normal(4)
LOGITS, LABELS = rng.standard_normal((5, 3)), np.array([0, 2, 1, 1, 0])
G = rng.standard_normal((2, 4, 4, 4))
GEOMETRY = ((2, 6, 6, 3), ((0, 0), (0, 0)), (2, 6, 6, 3), (2, 2), (2, 2), (3, 3))

DECLARED = [   # (primitive, positional arguments, keyword arguments): every rule that declares keeps=
    (P.add_vwc.primitive, (A, B), {}), (P.subtract_vwc.primitive, (A, B), {}),
    (P.multiply_vwc.primitive, (A, B), {}), (P.divide_vwc.primitive, (A, B), {}),
    (P.power_vwc.primitive, (A, B), {}), (P.maximum_vwc.primitive, (A, B), {}),
    (P.minimum_vwc.primitive, (A, B), {}), (P.matmul_vwc.primitive, (A, B.T), {}),
    (P.where_vwc.primitive, (A > 1, A, B), {}),
    (cnn.conv2d, (X, F, BIAS), {}), (cnn._conv, (X, F), dict(strides=(1, 1), amounts=((0, 0), (0, 0)))),
    (cnn._conv_dx, (G, F), dict(shape=X.shape, strides=(1, 1), amounts=((0, 0), (0, 0)))),
    (cnn._conv_dfilter, (X, G), dict(size=(3, 3), strides=(1, 1), amounts=((0, 0), (0, 0)))),
    (cnn.max_pool2d, (X,), {}), (cnn.softmax_cross_entropy, (LOGITS, LABELS), {}),
    (P.sum_vwc.primitive, (A,), dict(axis=0)), (P.mean_vwc.primitive, (A,), dict(axis=1, keepdims=True)),
    (P.reshape_vwc.primitive, (A,), dict(shape=(4, 3))), (P.transpose_vwc.primitive, (A,), dict(axes=(1, 0))),
    (P.swapaxes_vwc.primitive, (A,), dict(axis1=0, axis2=1)), (P.squeeze_vwc.primitive, (A[None],), {}),
    (P.expand_dims_vwc.primitive, (A,), dict(axis=0)), (P.ravel_vwc.primitive, (A,), {}),
    (P.broadcast_to_vwc.primitive, (A[:1],), dict(shape=(3, 4))), (P.negative_vwc.primitive, (A,), {}),
    (cnn._pool_scatter, (rng.standard_normal((2, 3, 3, 3)),), dict(winner=np.zeros((2, 3, 3, 3), np.uint8), geometry=GEOMETRY)),
    (cnn._pool_gather, (X,), dict(winner=np.zeros((2, 3, 3, 3), np.uint8), geometry=GEOMETRY))]

@pytest.mark.parametrize("prim, args, kwargs", DECLARED, ids=[p.name for p, _, _ in DECLARED])
def test_a_declaration_names_every_array_its_chains_keep(prim, args, kwargs):
    "Each input's chain reads no array of the call beyond what `keeps` declares for that input."
    assert prim.keeps is not None
    _, chains = prim.vwc(*args, **kwargs)
    chains = chains if isinstance(chains, tuple) else (chains,)
    names = list(prim.vwc.__code__.co_varnames[:prim.vwc.__code__.co_argcount + prim.vwc.__code__.co_kwonlyargcount])
    given = dict(zip(names, args)) | kwargs
    for i, chain in enumerate(chains):
        if chain is None: continue
        kept = {n for n, a in given.items() if type(a) is np.ndarray and engine._keeps(chain, a)}
        declared = {n for j, _, n in prim.kept if j == i}
        assert kept <= declared, f"{prim.name}: input {names[i]}'s chain keeps {sorted(kept)}, it declares {sorted(declared)}"

def test_only_what_a_recorded_chain_reads_is_locked():
    c, m = np.array([1., 2.]), np.array([True, False])
    seen = []
    def f(w):
        y = np.where(m, w, c) + c / w                 # w's chains read the mask, and w itself: c is read by no recorded chain
        seen.append((m.flags.writeable, c.flags.writeable))
        return y.sum()
    np.testing.assert_allclose(fd.gradient(f, np.array([1., 2.])), [1. - 1., -2. / 4])
    assert seen == [(False, True)] and m.flags.writeable
    x, filt, seen = X.copy(), F.copy(), []
    def g(x):
        y = cnn.conv2d(x, filt, BIAS)                 # the filter a constant: x's chain reads it
        seen.append(filt.flags.writeable)
        return y.sum()
    fd.gradient(g, x)
    assert seen == [False] and filt.flags.writeable

def test_keeps_must_name_arguments_of_the_vwc():
    def twice_vwc(x): return 2 * x, lambda g: 2 * g
    with pytest.raises(DifferentiationError, match=r"twice: keeps names \['y'\]"):
        P.Primitive('twice', twice_vwc, keeps=('y',))
    assert P.Primitive('twice', twice_vwc, keeps=()).kept == ()
    assert P.Primitive('twice', twice_vwc, keeps=dict(x='x')).kept == ((0, 0, 'x'),)

def test_labels_written_after_the_loss_leave_its_gradient_right():
    labels = LABELS.copy()
    def f(logits):
        loss = cnn.softmax_cross_entropy(logits, labels=labels)
        labels[0] = 2                                 # the next batch's: the chain made its one-hot rows already
        return loss
    np.testing.assert_allclose(fd.gradient(f, LOGITS), fd.gradient(lambda l: cnn.softmax_cross_entropy(l, LABELS), LOGITS))
    assert labels.flags.writeable and labels[0] == 2

def test_a_declared_index_passed_by_keyword_is_locked():
    idx = np.array([2, 0])
    def f(x):
        y = np.take(x, indices=idx)                   # take's pullback scatters by idx
        idx[0] = 1
        return (y * np.array([1., 10.])).sum()
    with pytest.raises(DifferentiationError, match="backward pass reads was written"):
        fd.gradient(f, np.ones(3))
    assert idx.flags.writeable and list(idx) == [2, 0]

def test_the_batch_of_a_convolution_is_locked_its_bias_is_not():
    x, seen = X.copy(), []
    def f(filter, bias):
        y = cnn.conv2d(x, filter, bias)
        seen.append(x.flags.writeable)                # the filter's cotangent is rebuilt from x: locked
        return y.sum()
    fd.gradient(f, F, BIAS)
    assert seen == [False] and x.flags.writeable

def test_a_custom_rule_is_still_looked_into():
    buf = np.array([1., 2., 3.])
    def scale_vwc(x, s): return x * s, (lambda g: g * s, None)
    scale = P.Primitive('scale', scale_vwc)           # no keeps=: the engine looks into its chains
    assert scale.kept is None
    def f(x):
        y = scale(x, buf)
        buf[0] = 7.
        return y.sum()
    with pytest.raises(DifferentiationError, match="passed to scale"):
        fd.gradient(f, np.ones(3))
    assert buf.flags.writeable

def test_steps_leave_no_lock_behind():
    model = [fd.Conv2D(filter=F.astype(np.float32), bias=BIAS.astype(np.float32), activation=None),
             fd.MaxPool2D(), fd.Flatten(), fd.Dense(weight=rng.standard_normal((16, 3)).astype(np.float32),
                                                   bias=np.zeros(3, np.float32), activation=None)]
    x = X[:, :, :, :].astype(np.float32)
    loss = lambda m: fd.softmax_cross_entropy(fd.sequenced(x, through=m), LABELS[:2])
    for _ in range(3): fd.value_with_gradient(loss, model)
    gc.collect()
    assert engine._locked == {}
    assert all(a.flags.writeable for a in (x, model[0].filter, model[0].bias, model[3].weight, model[3].bias))
    value, pb = fd.value_with_pullback(loss, model)
    assert not x.flags.writeable and not model[3].weight.flags.writeable
    del pb; gc.collect()
    assert engine._locked == {} and x.flags.writeable


# ---- the collector waits while a tape is in use (issue 22, point 1) ----

class _Node:
    "An object in a reference cycle, as user code makes them."
    def __init__(self): self.other = None

def test_memory_stays_flat_and_user_cycles_are_collected_over_10000_steps():
    import tracemalloc, weakref
    assert gc.isenabled()
    alive = weakref.WeakSet()                         # the cycles not collected yet
    def f(x):
        a, b = _Node(), _Node()
        a.other, b.other = b, a                       # a cycle, dropped when f returns
        alive.add(a)
        return (np.sin(x) * x).sum()
    x = np.ones(3)
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(1_000): fd.gradient(f, x)
        early = tracemalloc.get_traced_memory()[0]
        for _ in range(9_000): fd.gradient(f, x)
        late = tracemalloc.get_traced_memory()[0]
    finally: tracemalloc.stop()
    assert gc.isenabled()                             # the collector is on between steps
    assert late - early < 64 * 1024, (early, late)    # 9,000 more steps: no more memory (each cycle is ~0.3 KiB)
    assert len(alive) < 1_000, len(alive)             # the automatic collections freed them, with no gc.collect()

def test_few_young_and_no_full_collections_while_recording():
    runs = []
    count = lambda phase, info: runs.append(info['generation']) if phase == 'start' else None
    def f(x):
        for _ in range(20_000): x = np.sin(x)         # 20,000 entries: with the default thresholds, hundreds of collections
        return x
    gc.callbacks.append(count)
    try: fd.gradient(f, 0.3)
    finally: gc.callbacks.remove(count)
    assert 2 not in runs and len(runs) < 40, runs       # young ones every 20,000 new objects; full ones paused

@pytest.mark.parametrize('vwc, args', [(P.add_vwc, (0.3, 0.2)), (P.subtract_vwc, (0.3, 0.2)), (P.negative_vwc, (0.3,)),
                                       (P.positive_vwc, (0.3,)), (P.add_vwc, (A, B))])
def test_a_chain_that_reads_nothing_is_made_once_not_per_operation(vwc, args):
    "`+` on a tape makes no new function: its chains are shared (a scalar chain spends much of its time making them)."
    (_, first), (_, second) = vwc(*args), vwc(*args)
    chains = lambda c: c if isinstance(c, tuple) else (c,)
    assert all(a is b for a, b in zip(chains(first), chains(second)))
    assert all(c.__closure__ is None for c in chains(first))      # it keeps nothing, so no lock or saved bytes either
    g = np.full(np.shape(vwc(*args)[0]), 2.0)
    expected = {P.subtract_vwc: (2.0, -2.0), P.negative_vwc: (-2.0,)}.get(vwc, (2.0, 2.0))
    assert [float(np.mean(c(g))) for c in chains(first)] == list(expected[:len(chains(first))])

def test_remainders_x_chain_is_shared_its_y_chain_keeps_the_quotient():
    (_, (dx1, dy1)), (_, (dx2, dy2)) = P.remainder_vwc(7.5, 2.0), P.remainder_vwc(7.5, 2.0)
    assert dx1 is dx2 and dx1.__closure__ is None and dx1(3.0) == 3.0
    assert dy1 is not dy2 and dy1(1.0) == -3.0                     # -g * floor(7.5 / 2): it reads x and y
