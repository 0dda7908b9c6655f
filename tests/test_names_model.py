"""The names model (lesson 09) on its pieces: the census first names read offline from the `names` package, a bigram
trained by fastad equal to the counted one, causal self-attention in plain NumPy differentiated by fastad (central
differences agree, no gradient flows from later positions), and Bengio's MLP trained with AdamW, a warm-up-cosine
schedule and clipping beating the bigram on held-out names."""
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

def test_bengios_mlp_beats_the_bigram_on_dev_names(pairs):
    ((x, y), (xd, yd)) = pairs[3]
    rng = np.random.default_rng(1)
    out = fd.Dense(100, 27, rng=rng)
    m = MLP(fd.Embedding(27, 10, rng=rng), fd.Dense(30, 100, np.tanh, rng=rng),
            fd.Dense(weight=out.weight * np.float32(0.01), bias=out.bias))
    steps = 1000
    opt = fd.AdamW(m, fd.warmup_cosine_schedule(1e-2, 50, steps), weight_decay=0.01)
    done = 0
    while done < steps:
        for xb, yb in fd.batches((x, y), 64, rng=rng, drop_last=True):
            _, g = fd.value_with_gradient(lambda m: fd.softmax_cross_entropy(m(xb), yb), m)
            opt.update(m, fd.clip_by_global_norm(g, 1.0))
            done += 1
            if done == steps: break
    assert float(fd.softmax_cross_entropy(m(xd), yd)) < counted_bigram_dev(pairs) - 0.15
