"""Data-parallel gradients (fastad.data_parallel): the all-reduce mean over gradient trees, shards, a step on Dask
workers equal to the one-process step, and the hand-over of a model's leaves to PyTorch and JAX through DLPack."""
import logging, sys, unittest.mock
import numpy as np
import pytest
import fastad as fd
from fastad.errors import ArgumentError, MissingExtraError, ShapeError

class Tiny(fd.Layer):
    embedding: fd.Embedding
    output: fd.Dense
    def forward(self, x):
        e = self.embedding(x)
        return self.output(np.tanh(e.reshape(e.shape[0], -1)))

def tiny(seed=0):
    rng = np.random.default_rng(seed)
    return Tiny(fd.Embedding(7, 3, rng=rng), fd.Dense(6, 7, rng=rng))

def loss(m, x, y): return fd.softmax_cross_entropy(m(x), y)

def data(n=37, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 7, (n, 2)), rng.integers(0, 7, n)

def test_all_reduce_mean_of_model_gradients_is_the_whole_batch_gradient():
    m, (x, y) = tiny(), data()
    parts = fd.shards((x, y), 3)
    grads = [fd.gradient(lambda m: loss(m, *p), m) for p in parts]
    mean = fd.all_reduce_mean(grads, weights=[len(p[1]) for p in parts])
    whole = fd.gradient(lambda m: loss(m, x, y), m)
    assert type(mean) is Tiny
    for a, b in zip(fd.tree.flatten(mean)[0], fd.tree.flatten(whole)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        assert a.dtype == b.dtype == np.float32

def test_all_reduce_mean_on_lists_and_dicts_and_its_refusals():
    out = fd.all_reduce_mean([[np.array([1., 2.]), {'b': 3.0}], [np.array([3., 4.]), {'b': 5.0}]], weights=[1, 3])
    np.testing.assert_allclose(out[0], [2.5, 3.5]); assert out[1]['b'] == 4.5
    with pytest.raises(ShapeError, match='same model'): fd.all_reduce_mean([[np.ones(2)], [np.ones(3)]])
    with pytest.raises(ArgumentError, match='non-empty'): fd.all_reduce_mean([])
    with pytest.raises(ArgumentError, match='one finite non-negative number per tree'): fd.all_reduce_mean([[1.0], [2.0]], weights=[1, -1])

def test_all_reduce_mean_names_itself_for_trees_of_other_structures_and_refuses_infinite_weights():
    "Was a DifferentiationError saying the tree 'should be shaped like the value it belongs to'; weights=[1, inf] gave NaN."
    with pytest.raises(ShapeError, match=r"all_reduce_mean: trees\[1\] is a dict, but trees\[0\] is a list"):
        fd.all_reduce_mean([[np.ones(2)], {'a': np.ones(2)}])
    with pytest.raises(ShapeError, match=r"all_reduce_mean: trees\[1\] is a list of 2 items, but trees\[0\] is a list of 1"):
        fd.all_reduce_mean([[np.ones(2)], [np.ones(2), np.ones(1)]])
    with pytest.raises(ArgumentError, match='finite'): fd.all_reduce_mean([[1.0], [2.0]], weights=[1, np.inf])

def test_shards_cut_like_array_split_and_refuse_ragged_batches():
    x, y = data(10)
    parts = fd.shards((x, y), 3)
    assert [len(p[1]) for p in parts] == [4, 3, 3]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
    with pytest.raises(ShapeError, match='as many rows'): fd.shards((x, y[:9]), 2)
    with pytest.raises(ArgumentError, match='empty'): fd.shards(y, 11)

def test_a_missing_dask_is_named_with_its_extra():
    with unittest.mock.patch.dict(sys.modules, {'distributed': None}):
        with pytest.raises(MissingExtraError, match=r"pip install 'fastad\[cluster\]'"):
            fd.dask_value_with_gradient(None, loss, tiny(), data())

def test_import_fastad_imports_no_dask_torch_or_jax():
    import subprocess
    code = "import sys, fastad; print(sorted(m for m in ('dask', 'distributed', 'torch', 'jax') if m in sys.modules))"
    assert subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout.strip() == '[]'

def test_data_parallel_step_on_a_local_cluster_equals_the_one_process_step():
    distributed = pytest.importorskip('distributed')
    (x, y), models = data(41), [tiny(), tiny()]
    opts = [fd.AdamW(m, 1e-2, weight_decay=0.01) for m in models]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as client:
        for _ in range(2):
            v1, g1 = fd.value_with_gradient(lambda m: loss(m, x, y), models[0])
            v2, g2 = fd.dask_value_with_gradient(client, loss, models[1], (x, y))
            for opt, m, g in zip(opts, models, (g1, g2)): opt.update(m, g)
            np.testing.assert_allclose(v2, float(v1), rtol=1e-6)
        with pytest.raises(ArgumentError, match="dask_value_with_gradient: one shard per worker: 2 shards of a batch of 1 rows"):
            fd.dask_value_with_gradient(client, loss, models[1], (x[:1], y[:1]))      # more workers than rows
    for a, b in zip(fd.tree.flatten(models[0])[0], fd.tree.flatten(models[1])[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

def test_hand_over_to_torch_and_jax_and_back_shares_memory_where_it_can():
    torch = pytest.importorskip('torch'); jax = pytest.importorskip('jax')
    m = tiny()
    leaves, rebuild = fd.tree.flatten(m)
    tensors = [torch.from_dlpack(a) for a in leaves]
    assert all(t.data_ptr() == a.ctypes.data for t, a in zip(tensors, leaves))
    back = rebuild([np.from_dlpack(t) for t in tensors])
    assert all(b.ctypes.data == a.ctypes.data for b, a in zip(fd.tree.flatten(back)[0], leaves))
    x, y = data()
    assert float(loss(back, x, y)) == float(loss(m, x, y))
    from_jax = rebuild([np.asarray(jax.dlpack.from_dlpack(a)) for a in leaves])   # whether JAX copies is jaxlib's choice
    for a, b in zip(fd.tree.flatten(from_jax)[0], leaves):
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
    assert float(loss(from_jax, x, y)) == float(loss(m, x, y))
