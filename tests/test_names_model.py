"""The names model (lesson 09) on its pieces: the census first names read offline from the `names` package, a bigram
trained by fastad equal to the counted one, causal self-attention in plain NumPy differentiated by fastad (central
differences agree, no gradient flows from later positions); and what the lesson does not check: the MLP's gradient
through its embedding, the padded positions of the sequence loss, and a trained model saved and loaded."""
import os
import numpy as np
import pytest
import fastad as fd
from fastad.testing import numerical_gradient

def census_names():
    names = pytest.importorskip('names')
    folder, found = os.path.dirname(names.__file__), set()
    for file in ('dist.male.first', 'dist.female.first'):
        with open(os.path.join(folder, file)) as f: found.update(l.split()[0].lower() for l in f if l.strip())
    return sorted(found)

@pytest.fixture(scope='module')
def pairs():
    words = census_names()
    stoi = {'.': 0, **{c: i + 1 for i, c in enumerate(sorted(set(''.join(words))))}}
    order = np.random.default_rng(0).permutation(len(words))
    def contexts(ws, block):
        X, Y = [], []
        for w in ws:
            c = [0] * block
            for ch in w + '.': X.append(c); Y.append(stoi[ch]); c = c[1:] + [stoi[ch]]
        return np.array(X), np.array(Y)
    train, dev = [words[i] for i in order[:4600]], [words[i] for i in order[4600:]]
    return {block: (contexts(train, block), contexts(dev, block)) for block in (1, 3)}

def counted_bigram_dev(pairs):
    ((x, y), (xd, yd)) = pairs[1]
    counts = np.ones((27, 27)); np.add.at(counts, (x[:, 0], y), 1)
    return -np.log((counts / counts.sum(1, keepdims=True))[xd[:, 0], yd]).mean()

def test_the_census_names_are_read_offline():
    words = census_names()
    assert len(words) == 5163 and all(w.isalpha() and w.islower() for w in words)
    assert len(set(''.join(words))) == 26 and max(map(len, words)) == 11

def test_a_bigram_trained_by_fastad_is_the_counted_one(pairs):
    ((x, y), (xd, yd)) = pairs[1]
    table = fd.Embedding(weight=np.zeros((27, 27), np.float32))
    opt = fd.AdamW(table, 0.3, weight_decay=1e-4)
    for _ in range(150):
        _, g = fd.value_with_gradient(lambda t: fd.softmax_cross_entropy(t(x[:, 0]), y), table)
        opt.update(table, g)
    assert abs(float(fd.softmax_cross_entropy(table(xd[:, 0]), yd)) - counted_bigram_dev(pairs)) < 0.02

def causal_attention(params, h):
    "One head of causal self-attention in plain NumPy."
    q, k, v = h @ params['q'], h @ params['k'], h @ params['v']
    scores = q @ k.swapaxes(-1, -2) * q.shape[-1] ** -0.5
    T = scores.shape[-1]
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v

def test_causal_attention_in_numpy_is_differentiated_and_causal():
    rng = np.random.default_rng(0)
    params, h = {n: rng.normal(size=(4, 4)) for n in 'qkv'}, rng.normal(size=(2, 5, 4))
    f = lambda p: (causal_attention(p, h) ** 2).sum()
    got, expected = fd.gradient(f, params), numerical_gradient(f, params)
    for n in 'qkv': np.testing.assert_allclose(got[n], expected[n], rtol=1e-6, atol=1e-8)
    for t in range(4):
        dh = fd.gradient(lambda h: causal_attention(params, h)[:, t].sum(), h)
        assert np.abs(dh[:, t + 1:]).max() == 0 and np.abs(dh[:, :t + 1]).max() > 0

class MLP(fd.Layer):
    embedding: fd.Embedding
    hidden: fd.Dense
    output: fd.Dense
    def forward(self, x):
        e = self.embedding(x)
        return self.output(self.hidden(e.reshape(e.shape[0], -1)))

def small_mlp(seed=1, dtype=np.float64):
    rng = np.random.default_rng(seed)
    emb = fd.Embedding(27, 4, rng=rng, dtype=dtype)
    hidden, out = fd.Dense(12, 8, np.tanh, rng=rng), fd.Dense(8, 27, rng=rng)
    cast = lambda d: fd.Dense(weight=d.weight.astype(dtype), bias=d.bias.astype(dtype), activation=d.activation)
    return MLP(emb, cast(hidden), cast(out))

def test_the_mlps_gradient_agrees_with_central_differences(pairs):
    "The lesson trains the MLP but checks only its loss: here its gradient, through the embedding table, is checked."
    ((x, y), _) = pairs[3]
    m, xb, yb = small_mlp(), x[:40], y[:40]
    f = lambda m: fd.softmax_cross_entropy(m(xb), yb)
    got, expected = fd.gradient(f, m), numerical_gradient(f, m)
    for a, b in zip(fd.tree.flatten(got)[0], fd.tree.flatten(expected)[0]): np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    assert (got.embedding.weight[np.setdiff1d(np.arange(27), xb)] == 0).all()     # rows never looked up get nothing

def masked_loss(logits, y):
    "The lesson's sequence loss: cross entropy over the positions whose target is not -1."
    keep = y.reshape(-1) >= 0
    return fd.softmax_cross_entropy(logits.reshape(-1, 27)[keep], y.reshape(-1)[keep])

def test_padded_positions_neither_count_in_the_loss_nor_get_a_gradient():
    rng = np.random.default_rng(3)
    logits, y = rng.normal(size=(2, 5, 27)), np.array([[3, 1, 0, -1, -1], [7, 0, -1, -1, -1]])
    keep = y >= 0
    by_hand = np.mean([np.log(np.exp(logits[i, t]).sum()) - logits[i, t, y[i, t]] for i, t in zip(*np.nonzero(keep))])
    np.testing.assert_allclose(float(masked_loss(logits, y)), by_hand, rtol=1e-12)
    g = fd.gradient(lambda l: masked_loss(l, y), logits)
    assert (g[~keep] == 0).all() and (np.abs(g[keep]).sum(-1) > 0).all()

def test_a_trained_names_model_round_trips_through_save_and_load(pairs, tmp_path):
    ((x, y), (xd, yd)) = pairs[3]
    m = small_mlp(dtype=np.float32)
    opt = fd.AdamW(m, fd.warmup_cosine_schedule(1e-2, 5, 50), weight_decay=0.01)
    for xb, yb in list(fd.batches((x, y), 64, rng=np.random.default_rng(0)))[:50]:
        opt.update(m, fd.clip_by_global_norm(fd.gradient(lambda m: fd.softmax_cross_entropy(m(xb), yb), m), 2.0))
    fd.save(m, tmp_path / 'names.npz')
    back = fd.load(tmp_path / 'names.npz', like=small_mlp(seed=7, dtype=np.float32))
    assert float(fd.softmax_cross_entropy(back(xd), yd)) == float(fd.softmax_cross_entropy(m(xd), yd))
