"""Workload 1: one MNIST-sized MLP step, 60,000 x 784 -> 50 -> 1, MSE, float32: the loss and the parameters' gradients."""
import math
import numpy as np
from .common import (Contender, as_numpy, numpy_gemm, import_torch, torch_gemm, import_jax, jax_gemm, import_autograd,
                     autograd_version, fastad_version)

TITLE = 'MNIST MLP step {rows:,}×784→50→1, MSE, params only'
UNIT, SCALE = 'ms', 1e3
CASES = ("step",)
ROUNDS = 30                            # a step is GEMM-bound, and two GEMM-bound processes differ by a few per cent: more rounds
N_IN, N_HIDDEN = 784, 50

def sizes(quick): return dict(rows=2_000 if quick else 60_000)

def data(rows):
    "The same inputs, targets and parameters in every process: random normal rows (only shapes matter here)."
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, N_IN), dtype=np.float32)
    y = rng.integers(0, 10, rows).astype(np.float32)
    params = [rng.standard_normal((N_IN, N_HIDDEN), dtype=np.float32) * np.float32(math.sqrt(2 / N_IN)),
              np.zeros(N_HIDDEN, np.float32),
              rng.standard_normal((N_HIDDEN, 1), dtype=np.float32) * np.float32(math.sqrt(1 / N_HIDDEN)),
              np.zeros(1, np.float32)]
    return x, y, params

def loss_numpy(p, x, y):
    "The loss as a learner writes it in plain NumPy (fastad and autograd trace this very function)."
    h = np.maximum(x @ p[0] + p[1], 0)
    return ((((h @ p[2]) + p[3]).squeeze(-1) - y) ** 2).mean()

def fastad(size):
    import fastad as fd
    x, y, params = data(**size)
    params = tuple(params)
    step = lambda: as_numpy(*fd.value_with_gradient(lambda p: loss_numpy(p, x, y), params))
    return Contender(fastad_version(), {'step': step}, numpy_gemm())

def manual_step(x, y, w1, b1, w2, b2):
    "Lesson 02's manual forward and backward, in the array module of `x`: the loss and the parameters' gradients only."
    l1 = x @ w1 + b1
    mask = l1 > 0
    l2 = l1 * mask
    diff = (l2 @ w2 + b2)[:, 0] - y
    loss = (diff * diff).mean()
    g_out = (2 / len(y)) * diff[:, None]
    g_l1 = (g_out @ w2.T) * mask
    return loss, (x.T @ g_l1, g_l1.sum(0), l2.T @ g_out, g_out.sum(0))

def hand_numpy(size):
    "Lesson 02's manual forward and backward, computing only the parameters' gradients: the least work there is."
    x, y, params = data(**size)
    return Contender(np.__version__, {'step': lambda: as_numpy(*manual_step(x, y, *params))}, numpy_gemm())

def gemms_only(size):
    "The step's five matrix products and nothing else: a floor no implementation goes below."
    x, y, (w1, b1, w2, b2) = data(**size)
    l2 = np.maximum(x @ w1, 0); g_out = np.ones((len(x), 1), np.float32); g_l1 = np.ones((len(x), N_HIDDEN), np.float32)
    def step():
        x @ w1; l2 @ w2; x.T @ g_l1; l2.T @ g_out; g_out @ w2.T
    return Contender(np.__version__, {'step': step}, numpy_gemm())

def torch_step(torch, x, y, params, device='cpu'):
    "PyTorch's eager step on `device` (the GPU benchmark's too): the loss and the parameters' gradients, as tensors."
    tx, ty = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    ps = [torch.from_numpy(p.copy()).to(device).requires_grad_() for p in params]
    def step():
        w1, b1, w2, b2 = ps
        for p in ps: p.grad = None
        loss = (((torch.relu(tx @ w1 + b1) @ w2 + b2).squeeze(-1) - ty) ** 2).mean()
        loss.backward()
        return loss.detach(), [p.grad for p in ps]
    return step

def torch_eager(size):
    torch = import_torch()
    step = torch_step(torch, *data(**size))
    return Contender(torch.__version__, {'step': lambda: as_numpy(*step())}, torch_gemm(torch))

def jax_jit(size):
    jax, jnp = import_jax()
    x, y, params = data(**size)
    def loss(p, x, y): return (((jnp.maximum(x @ p[0] + p[1], 0) @ p[2] + p[3]).squeeze(-1) - y) ** 2).mean()
    vg = jax.jit(jax.value_and_grad(loss))
    p, jx, jy = [jnp.asarray(a) for a in params], jnp.asarray(x), jnp.asarray(y)
    def step():
        value, grads = jax.block_until_ready(vg(p, jx, jy))
        return as_numpy(value, grads)
    return Contender(jax.__version__, {'step': step}, jax_gemm(jax, jnp))

def hips_autograd(size):
    autograd, anp = import_autograd()
    x, y, params = data(**size)
    vg = autograd.value_and_grad(lambda p: ((((anp.maximum(x @ p[0] + p[1], 0) @ p[2]) + p[3])[:, 0] - y) ** 2).mean())
    step = lambda: as_numpy(*vg(list(params)))
    return Contender(autograd_version(), {'step': step}, numpy_gemm())

CONTENDERS = {'fastad': fastad, 'numpy': hand_numpy, 'torch': torch_eager, 'jax': jax_jit, 'autograd': hips_autograd,
              'floor': gemms_only}
FLOOR_NOTE = 'the GEMMs alone'
