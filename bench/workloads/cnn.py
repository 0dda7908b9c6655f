"""Workload 3: a tiny CNN's training step: [10,16,16,3] -> conv 5x5x3->6 (valid) -> maxpool 2x2 -> flatten -> dense 216->10
-> softmax cross-entropy, float32, NHWC. The loss and the four parameters' gradients (not the input's)."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from .common import (Contender, Skip, as_numpy, numpy_gemm, import_torch, torch_gemm, import_jax, jax_gemm,
                     import_autograd, autograd_version, fastad_version)

TITLE = 'tiny CNN step [10,16,16,3], conv 5×5×3→6, pool, dense, softmax CE'
UNIT, SCALE = 'µs', 1e6
CASES = ('step',)
N, H, C, K, F, P, CLASSES = 10, 16, 3, 5, 6, 2, 10
HO = H - K + 1                      # 12: a valid convolution's output side
HP = HO // P                        # 6: after pooling
FLAT = HP * HP * F                  # 216

def sizes(quick): return {}

def data(n=N, h=H, c=C, k=K, f=F):
    "The same batch, labels and parameters in every process (this workload's geometry unless told another)."
    rng = np.random.default_rng(0)
    flat = ((h - k + 1) // P) ** 2 * f
    x = rng.standard_normal((n, h, h, c), dtype=np.float32)
    labels = rng.integers(0, CLASSES, n)
    params = [rng.standard_normal((k, k, c, f), dtype=np.float32) * np.float32(np.sqrt(2 / (k * k * c))),
              np.zeros(f, np.float32),
              rng.standard_normal((flat, CLASSES), dtype=np.float32) * np.float32(np.sqrt(1 / flat)),
              np.zeros(CLASSES, np.float32)]
    return x, labels, params

def im2col(x):
    "Every 5x5x3 window of `x` as a row: (N*12*12, 75), its columns in the weight's (kh, kw, c) order."
    return sliding_window_view(x, (K, K), axis=(1, 2)).transpose(0, 1, 2, 4, 5, 3).reshape(N * HO * HO, K * K * C)

def cross_entropy(logits, labels):
    "Softmax cross-entropy as a learner writes it in NumPy: shift by the row maximum, log-sum-exp, pick each label."
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -log_probs[np.arange(len(labels)), labels].mean()

def traced_loss(p, x, labels):
    "The step in plain NumPy operations (for engines that trace NumPy code): conv as one GEMM over windows."
    conv = (im2col(x) @ p[0].reshape(K * K * C, F) + p[1]).reshape(N, HO, HO, F)
    pooled = conv.reshape(N, HP, P, HP, P, F).max(axis=(2, 4))
    logits = pooled.reshape(N, FLAT) @ p[2] + p[3]
    return cross_entropy(logits, labels)

def traced_loss_einsum(p, x, labels):
    "The same step with the convolution as an einsum over the windows (planned, as lesson 01 teaches)."
    windows = sliding_window_view(x, (K, K), axis=(1, 2))              # (N, 12, 12, C, K, K)
    conv = np.einsum('nhwcij,ijcf->nhwf', windows, p[0], optimize=True) + p[1]
    pooled = conv.reshape(N, HP, P, HP, P, F).max(axis=(2, 4))
    logits = pooled.reshape(N, FLAT) @ p[2] + p[3]
    return cross_entropy(logits, labels)

def fastad_layers(size):
    "fastad's own CNN layers, when this fastad has them."
    import fastad as fd
    missing = [n for n in ('Conv2D', 'MaxPool2D', 'Flatten', 'Dense', 'softmax_cross_entropy') if not hasattr(fd, n)]
    if missing: raise Skip(f"fd.{', fd.'.join(missing)} not in this fastad yet (lesson 04's layers, the CNN layers)")
    x, labels, (wc, bc, wd, bd) = data()
    try:
        model = [fd.Conv2D(filter=wc, bias=bc, activation=None), fd.MaxPool2D(pool_size=(P, P), strides=(P, P)),
                 fd.Flatten(), fd.Dense(weight=wd, bias=bd, activation=None)]
        loss = lambda m: fd.softmax_cross_entropy(fd.sequenced(x, through=m), labels)
        value, grads = fd.value_with_gradient(loss, model)
    except Exception as e:
        raise Skip(f"fastad's CNN layers are there but the suite's call does not fit them: {type(e).__name__}: {e}")
    def step():
        value, (gc, _, _, gd) = fd.value_with_gradient(loss, model)
        return as_numpy(value, (gc.filter, gc.bias, gd.weight, gd.bias))
    return Contender(fastad_version(), {'step': step}, numpy_gemm())

def fastad_traced(size, loss=traced_loss, note='plain NumPy code traced, no layer classes: conv as one GEMM over windows'):
    "fastad differentiating the plain NumPy step (no layer classes): the engine on this workload today."
    import fastad as fd
    x, labels, params = data()
    params = tuple(params)
    step = lambda: as_numpy(*fd.value_with_gradient(lambda p: loss(p, x, labels), params))
    return Contender(fastad_version(), {'step': step}, numpy_gemm(), note=note)

def fastad_traced_einsum(size):
    "The plain NumPy step with the convolution written as an einsum over sliding_window_view windows."
    return fastad_traced(size, traced_loss_einsum, 'plain NumPy code traced: conv as an einsum over windows')

def hand_numpy(size):
    "Forward and backward by hand: im2col with sliding_window_view, one GEMM per product, pooling by a mask."
    x, labels, (wc, bc, wd, bd) = data()
    onehot = np.eye(CLASSES, dtype=np.float32)[labels]
    wmat = wc.reshape(K * K * C, F)
    def step():
        cols = im2col(x)
        conv = cols @ wmat + bc
        windows = conv.reshape(N, HP, P, HP, P, F)
        pooled = windows.max(axis=(2, 4), keepdims=True)
        flat = pooled.reshape(N, FLAT)
        logits = flat @ wd + bd
        shifted = logits - logits.max(1, keepdims=True)
        e = np.exp(shifted)
        total = e.sum(1, keepdims=True)
        loss = (np.log(total)[:, 0] - shifted[np.arange(N), labels]).mean()
        g_logits = (e / total - onehot) / N
        g_pooled = (g_logits @ wd.T).reshape(N, HP, 1, HP, 1, F)
        g_conv = ((windows == pooled) * g_pooled).reshape(N * HO * HO, F)    # ties have probability zero here
        return as_numpy(loss, ((cols.T @ g_conv).reshape(K, K, C, F), g_conv.sum(0), flat.T @ g_logits, g_logits.sum(0)))
    return Contender(np.__version__, {'step': step}, numpy_gemm())

def torch_step(torch, x, labels, params, device='cpu'):
    "PyTorch's eager step on `device` (the GPU benchmark's too), NCHW: the loss and the parameters' gradients, as tensors."
    F_ = torch.nn.functional
    n, flat = len(x), params[2].shape[0]
    tx = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device)          # NCHW, PyTorch's layout
    tl = torch.from_numpy(labels).to(device)
    wc = torch.from_numpy(params[0].transpose(3, 2, 0, 1).copy()).to(device).requires_grad_()   # (out, in, kh, kw)
    bc, wd, bd = [torch.from_numpy(p.copy()).to(device).requires_grad_() for p in params[1:]]
    ps = [wc, bc, wd, bd]
    def step():
        for p in ps: p.grad = None
        pooled = F_.max_pool2d(F_.conv2d(tx, wc, bc), P)
        logits = pooled.permute(0, 2, 3, 1).reshape(n, flat) @ wd + bd     # flatten in NHWC order, as the others
        loss = F_.cross_entropy(logits, tl)
        loss.backward()
        return loss.detach(), (wc.grad.permute(2, 3, 1, 0), bc.grad, wd.grad, bd.grad)
    return step

def torch_eager(size):
    torch = import_torch()
    step = torch_step(torch, *data())
    return Contender(torch.__version__, {'step': lambda: as_numpy(*step())}, torch_gemm(torch))

def jax_jit(size):
    jax, jnp = import_jax()
    x, labels, params = data()
    def loss(p, x, labels):
        conv = jax.lax.conv_general_dilated(x, p[0], (1, 1), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC')) + p[1]
        pooled = conv.reshape(N, HP, P, HP, P, F).max(axis=(2, 4))
        logits = pooled.reshape(N, FLAT) @ p[2] + p[3]
        return -jax.nn.log_softmax(logits)[jnp.arange(N), labels].mean()
    vg = jax.jit(jax.value_and_grad(loss))
    p, jx, jl = [jnp.asarray(a) for a in params], jnp.asarray(x), jnp.asarray(labels)
    def step():
        value, grads = jax.block_until_ready(vg(p, jx, jl))
        return as_numpy(value, grads)
    return Contender(jax.__version__, {'step': step}, jax_gemm(jax, jnp))

def hips_autograd(size):
    autograd, anp = import_autograd()
    from autograd.scipy.special import logsumexp
    x, labels, params = data()
    def loss(p):
        conv = (im2col(x) @ anp.reshape(p[0], (K * K * C, F)) + p[1])
        pooled = anp.max(anp.reshape(conv, (N, HP, P, HP, P, F)), axis=(2, 4))
        logits = anp.reshape(pooled, (N, FLAT)) @ p[2] + p[3]
        return -(logits - logsumexp(logits, axis=1, keepdims=True))[anp.arange(N), labels].mean()
    vg = autograd.value_and_grad(loss)
    step = lambda: as_numpy(*vg(list(params)))
    return Contender(autograd_version(), {'step': step}, numpy_gemm())

CONTENDERS = {'fastad': fastad_layers, 'fastad, traced NumPy': fastad_traced, 'fastad, traced einsum': fastad_traced_einsum,
              'numpy': hand_numpy,
              'torch': torch_eager, 'jax': jax_jit, 'autograd': hips_autograd}
