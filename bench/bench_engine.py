"""How much does fastad's engine cost? Ratios against hand-written NumPy (and PyTorch / JAX when installed).

Run:  .venv/bin/python bench/bench_engine.py [--quick] [--repeats N]

Two workloads, each measured in one run, interleaved (every round runs every contender once, in an order
that rotates from round to round), reporting medians and paired ratios, because this machine's speed drifts:

1. MNIST-shaped MLP step: 60,000 x 784 float32 inputs, 50 hidden units, 1 output, MSE. The loss and the
   gradients of the four parameters.
2. A chain of 1,000 scalar operations (sin, *0.5, +0.1, exp; float64): gradient, forward and backward.

Nothing here asserts a timing; it prints ratios and the goals beside them.
"""
import argparse, math, time
import numpy as np
import fastad as fd
from fastad.data import progress

# --- workload 1: the MLP step -------------------------------------------------------------------------
class MLP(fd.Differentiable):
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

def mlp_loss(m, x, y):
    "The loss as a learner writes it: plain NumPy."
    h = np.maximum(x @ m.w1 + m.b1, 0)
    out = h @ m.w2 + m.b2
    return ((out.squeeze(-1) - y) ** 2).mean()

def numpy_params_only(m, x, y):
    "Hand-written forward and backward, computing only the parameter gradients: the least work there is."
    l1 = x @ m.w1 + m.b1
    mask = l1 > 0
    l2 = l1 * mask
    diff = (l2 @ m.w2 + m.b2)[:, 0] - y
    loss = (diff * diff).mean()
    g_out = (2 / len(y)) * diff[:, None]
    g_l1 = (g_out @ m.w2.T) * mask
    return loss, (x.T @ g_l1, g_l1.sum(0), l2.T @ g_out, g_out.sum(0))

def numpy_with_input_grad(m, x, y):
    "The lesson's manual version, written inline: it also computes the input's gradient, which training never needs."
    l1 = x @ m.w1 + m.b1
    l2 = np.maximum(l1, 0)
    diff = (l2 @ m.w2 + m.b2)[:, 0] - y
    loss = (diff * diff).mean()
    g_out = (2 / len(y)) * diff[:, None]
    g_l2 = g_out @ m.w2.T
    g_l1 = g_l2 * (l1 > 0)
    return loss, (x.T @ g_l1, g_l1.sum(0), l2.T @ g_out, g_out.sum(0), g_l1 @ m.w1.T)

def lesson_contender(m, x, y):
    "Lesson 02's forward_and_backward with its gradient holders (made once, outside the timing), if it is there."
    try: from fastad.fully_connected import GradHolder, forward_and_backward
    except ImportError: return None, 'inline copy'
    holders = [GradHolder(v) for v in (x, m.w1, m.b1, m.w2, m.b2)]
    forward_and_backward(holders[0], y, *holders[1:])
    return (lambda: forward_and_backward(holders[0], y, *holders[1:])), holders

def gemms_only(m, x, y, g_out, g_l1, l2):
    "Just the five matrix products of a step: a floor no implementation can go below."
    return x @ m.w1, l2 @ m.w2, x.T @ g_l1, l2.T @ g_out, g_out @ m.w2.T

def torch_contender(m, x, y):
    try: import torch
    except ImportError: return None
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    params = [torch.from_numpy(getattr(m, k).copy()).requires_grad_() for k in ('w1', 'b1', 'w2', 'b2')]
    def step():
        w1, b1, w2, b2 = params
        for p in params: p.grad = None
        loss = (((torch.relu(tx @ w1 + b1) @ w2 + b2).squeeze(-1) - ty) ** 2).mean()
        loss.backward()
        return loss
    return step

def jax_contender(m, x, y):
    try: import jax, jax.numpy as jnp
    except ImportError: return None
    def loss(p, x, y): return ((jnp.maximum(x @ p[0] + p[1], 0) @ p[2] + p[3]).squeeze(-1) - y) ** 2
    vg = jax.value_and_grad(lambda p, x, y: loss(p, x, y).mean())
    p = [jnp.asarray(getattr(m, k)) for k in ('w1', 'b1', 'w2', 'b2')]
    jx, jy = jnp.asarray(x), jnp.asarray(y)
    return lambda: jax.block_until_ready(vg(p, jx, jy))

def interleaved(contenders, repeats, desc='rounds'):
    """Seconds per round of each contender: every round runs each once, `repeats` rounds after a warm-up.
    The order rotates from round to round, so that no contender always follows the same neighbour: one that
    allocates a lot leaves the allocator and caches in a state the next one pays for."""
    names = list(contenders)
    times = {name: [] for name in names}
    for round_ in progress(range(repeats + 1), desc=desc):   # on stderr, cleared when done: the table stays clean
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            start = time.perf_counter(); contenders[name](); elapsed = time.perf_counter() - start
            if round_: times[name].append(elapsed)
    return {name: np.array(t) for name, t in times.items()}

def ratio(times, a, b):
    "Median over rounds of a/b, each round's pair measured back to back: robust to the machine's drift."
    return float(np.median(times[a] / times[b]))

def mnist_shaped(n, m_in, rng):
    "MNIST from the local cache when it is there in full (no download), else random data of the same shape."
    try:
        from fastad.data import load_mnist
        x, y = load_mnist(download=False, verbose=False)[:2]
        if x.shape == (60_000, m_in) and type(x) is np.ndarray:
            return np.ascontiguousarray(x[:n]), y[:n].astype(np.float32), 'MNIST (cached)'
    except Exception: pass                    # the benchmark needs shapes, not digits
    x = rng.standard_normal((n, m_in), dtype=np.float32)
    return x, rng.integers(0, 10, n).astype(np.float32), 'random normal data'

def bench_mlp(repeats, n=60_000):
    rng = np.random.default_rng(0)
    m_in, nh = 784, 50
    x, y, source = mnist_shaped(n, m_in, rng)
    model = MLP(rng.standard_normal((m_in, nh), dtype=np.float32) * np.float32(math.sqrt(2 / m_in)), np.zeros(nh, np.float32),
                rng.standard_normal((nh, 1), dtype=np.float32) * np.float32(math.sqrt(1 / nh)), np.zeros(1, np.float32))
    value, grads = fd.value_with_gradient(lambda m: mlp_loss(m, x, y), model)
    ref_loss, ref = numpy_params_only(model, x, y)
    lesson, holders = lesson_contender(model, x, y)
    manual = (numpy_with_input_grad(model, x, y)[1][:4] if lesson is None else [h.grad for h in holders[1:]])
    for k, r, r2 in zip(('w1', 'b1', 'w2', 'b2'), ref, manual):       # same numbers, same dtype, or no benchmark
        g = getattr(grads, k)
        assert g.dtype == np.float32 and np.allclose(g, r, rtol=1e-3, atol=1e-5), k
        assert np.allclose(r2, r, rtol=1e-3, atol=1e-5), k
    l1 = x @ model.w1 + model.b1; l2 = np.maximum(l1, 0)
    g_out = np.ones((n, 1), np.float32); g_l1 = np.ones((n, nh), np.float32)
    contenders = {
        'fastad value_with_gradient': lambda: fd.value_with_gradient(lambda m: mlp_loss(m, x, y), model),
        'numpy, parameters only': lambda: numpy_params_only(model, x, y),
        'numpy, with input gradient': lesson or (lambda: numpy_with_input_grad(model, x, y)),
        'the GEMMs alone': lambda: gemms_only(model, x, y, g_out, g_l1, l2),
    }
    for name, make in (('pytorch eager', torch_contender), ('jax, no jit', jax_contender)):
        f = make(model, x, y)
        if f is not None: contenders[name] = f
    rounds = interleaved(contenders, repeats, 'MLP step')
    t = {name: float(np.median(v)) for name, v in rounds.items()}
    gemm_flops = 2 * n * m_in * nh * 2 + 2 * n * nh * 1 * 2 + 2 * n * nh * 1   # x@w1, x.T@g; l2@w2, l2.T@g; g@w2.T
    print(f"\nMLP step on {n:,} x {m_in} float32 ({source}), {nh} hidden, MSE (median of {repeats}, interleaved)")
    print(f"  'numpy, with input gradient' is {'lesson 02: fastad.fully_connected.forward_and_backward' if lesson else 'an inline copy of lesson 02'}")
    for name, s in t.items(): print(f"  {name:30s} {s * 1e3:8.2f} ms")
    ad = 'fastad value_with_gradient'
    spread = np.percentile(rounds['the GEMMs alone'], [10, 90]) * 1e3
    print(f"  machine: GEMMs at {gemm_flops / t['the GEMMs alone'] / 1e9:.1f} GFLOP/s this run "
          f"(10th-90th percentile of a round: {spread[0]:.1f}-{spread[1]:.1f} ms)")
    print(f"  fastad / numpy-parameters-only   = {ratio(rounds, ad, 'numpy, parameters only'):.3f}x   (goal: <= 1.05x)")
    print(f"  fastad / numpy-with-input-grad   = {ratio(rounds, ad, 'numpy, with input gradient'):.3f}x   (goal: < 1x)")
    print(f"  fastad / the GEMMs alone         = {ratio(rounds, ad, 'the GEMMs alone'):.3f}x")
    overhead = float(np.median(rounds[ad] - rounds['numpy, parameters only'])) * 1e6
    print(f"  engine overhead per step: {overhead:+,.0f} us (fastad minus hand-written NumPy, median within a round)")
    for other in ('pytorch eager', 'jax, no jit'):
        if other in t: print(f"  fastad / {other:22s}  = {ratio(rounds, ad, other):.3f}x")
    print("  (ratios: median over rounds of the ratio within a round; each round runs every contender once)")

# --- workload 2: a long chain of scalar operations -------------------------------------------------------
def chain(x, n=250):
    for _ in range(n):
        x = np.sin(x); x = x * 0.5; x = x + 0.1; x = np.exp(x)
    return x

class Scalar:
    "A minimal pure-Python scalar tape (micrograd-style): a reference for the least a Python tape can cost."
    __slots__ = ('data', 'grad', 'parents')
    def __init__(self, data, parents=()): self.data, self.grad, self.parents = data, 0.0, parents
    def sin(self): return Scalar(math.sin(self.data), ((self, math.cos(self.data)),))
    def exp(self):
        e = math.exp(self.data)
        return Scalar(e, ((self, e),))
    def __mul__(self, c): return Scalar(self.data * c, ((self, c),))
    def __add__(self, c): return Scalar(self.data + c, ((self, 1.0),))
    def backward(self):
        order, seen = [], set()
        stack = [self]
        while stack:                                   # the chain is a line: its reverse is a topological order
            v = stack.pop()
            if id(v) in seen: continue
            seen.add(id(v)); order.append(v); stack.extend(p for p, _ in v.parents)
        self.grad = 1.0
        for v in order:
            for p, local in v.parents: p.grad += local * v.grad

def scalar_tape_gradient(x0, n=250):
    x = leaf = Scalar(x0)
    for _ in range(n): x = (x.sin() * 0.5 + 0.1).exp()
    x.backward()
    return leaf.grad

def torch_scalar(x0, n=250):
    import torch
    x = leaf = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    for _ in range(n): x = torch.exp(torch.sin(x) * 0.5 + 0.1)
    x.backward()
    return leaf.grad

def bench_scalar(repeats):
    n_ops = 1000
    g = fd.gradient(chain)
    eps = 1e-6
    assert abs(g(0.3) - (chain(0.3 + eps) - chain(0.3 - eps)) / (2 * eps)) < 1e-6
    assert abs(g(0.3) - scalar_tape_gradient(0.3)) < 1e-12
    contenders = {'fastad gradient': lambda: g(0.3), 'plain forward (no derivative)': lambda: chain(0.3),
                  'minimal Python scalar tape': lambda: scalar_tape_gradient(0.3)}
    try:
        import torch  # noqa: F401
        contenders['pytorch eager'] = lambda: torch_scalar(0.3)
    except ImportError: pass
    rounds = interleaved(contenders, repeats, 'scalar chain')
    t = {name: float(np.median(v)) for name, v in rounds.items()}
    print(f"\nGradient of a chain of {n_ops:,} scalar operations, float64 (median of {repeats}, interleaved)")
    for name, s in t.items(): print(f"  {name:30s} {s / n_ops * 1e6:8.2f} us/op")
    print(f"  fastad: {t['fastad gradient'] / n_ops * 1e6:.2f} us/op, forward and backward together   (goal: < 3 us/op)")
    for other in ('minimal Python scalar tape', 'pytorch eager'):
        if other in t: print(f"  fastad / {other:26s} = {ratio(rounds, 'fastad gradient', other):.2f}x   (drifts less than us/op)")

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='fewer repeats and a smaller batch, for a smoke test')
    p.add_argument('--repeats', type=int, default=None)
    a = p.parse_args()
    repeats = a.repeats or (3 if a.quick else 25)
    bench_mlp(repeats, n=6_000 if a.quick else 60_000)
    bench_scalar(repeats * 2)
