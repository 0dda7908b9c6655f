"""Workload 4: a training step's peak memory above the parameters: 32 x (Dense 256 + tanh), batch 4096, float32, MSE.

Each library runs in a fresh process. After a warm-up step, the kernel's high-water mark of the process's resident
memory is reset (/proc/self/clear_refs), and the step's peak is the new high-water mark minus the resident size just
before the step (parameters, batch and targets already there). glibc is told to map every block over 128 KiB on its
own (MALLOC_MMAP_THRESHOLD_), so freed arrays leave the resident set and the figure follows live arrays.
NumPy-based libraries are also measured with tracemalloc (NumPy reports its arrays to it)."""
import numpy as np
from .common import Contender, as_numpy, import_torch, import_jax, import_autograd, autograd_version, fastad_version

TITLE = '{layers} × (Dense {width} + tanh), batch {batch}: step peak memory above parameters'
UNIT, SCALE = 'MiB', 1 / 2**20
CASES = ('step',)
KIND = 'memory'

def sizes(quick): return dict(layers=4, width=128, batch=1024) if quick else dict(layers=32, width=256, batch=4096)

def data(layers, width, batch):
    "The same batch, targets and parameters in every process."
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, width), dtype=np.float32)
    y = rng.standard_normal((batch, width), dtype=np.float32)
    scale = np.float32(1 / np.sqrt(width))
    params = [(rng.standard_normal((width, width), dtype=np.float32) * scale, np.zeros(width, np.float32))
              for _ in range(layers)]
    return x, y, params

def activations_mib(layers, width, batch):
    "What the step must keep at least: one tanh output per layer (float32), in MiB."
    return layers * width * batch * 4 / 2**20

def numpy_loss(params, x, y):
    "The network and its loss in plain NumPy (fastad and autograd trace this very function)."
    h = x
    for w, b in params: h = np.tanh(h @ w + b)
    return ((h - y) ** 2).mean()

def flat_grads(grads): return [a for wb in grads for a in wb]

def fastad(size):
    import fastad as fd
    x, y, params = data(**size)
    params = [tuple(p) for p in params]
    def forward():
        value, pb = fd.value_with_pullback(lambda p: numpy_loss(p, x, y), params)
        return lambda: as_numpy(value, flat_grads(pb(np.float32(1))))
    return Contender(fastad_version(), {'step': lambda: forward()()}, forward={'step': forward})

def hand_numpy(size):
    "Forward keeping each layer's tanh output, backward by hand: what the step must hold and no more."
    x, y, params = data(**size)
    def forward():
        hs = [x]
        for w, b in params: hs.append(np.tanh(hs[-1] @ w + b))
        diff = hs[-1] - y
        value = (diff * diff).mean()
        def backward():
            g = (2 / diff.size) * diff
            grads = []
            for (w, b), h, h_in in zip(reversed(params), reversed(hs[1:]), reversed(hs[:-1])):
                g = g * (1 - h * h)
                grads.append((h_in.T @ g, g.sum(0)))
                g = g @ w.T
            return as_numpy(value, flat_grads(reversed(grads)))
        return backward
    return Contender(np.__version__, {'step': lambda: forward()()}, forward={'step': forward})

def torch_model(torch, params):
    "An nn.Sequential of (Linear + Tanh) blocks holding copies of `params`."
    blocks = []
    for w, b in params:
        lin = torch.nn.Linear(*w.shape)
        with torch.no_grad(): lin.weight.copy_(torch.from_numpy(w.T.copy())); lin.bias.copy_(torch.from_numpy(b))
        blocks.append(torch.nn.Sequential(lin, torch.nn.Tanh()))
    return torch.nn.Sequential(*blocks)

def torch_grads(model):
    return [g for block in model for g in (block[0].weight.grad.T, block[0].bias.grad)]

def torch_eager(size, run=None):
    torch = import_torch()
    x, y, params = data(**size)
    model, tx, ty = torch_model(torch, params), torch.from_numpy(x), torch.from_numpy(y)
    run = run or model
    def forward():
        model.zero_grad(set_to_none=True)
        loss = ((run(tx) - ty) ** 2).mean()
        def backward():
            loss.backward()
            return as_numpy(loss.detach(), torch_grads(model))
        return backward
    return Contender(torch.__version__, {'step': lambda: forward()()}, forward={'step': forward}), torch, model, tx

def jax_step(jax, jnp, size, network=None):
    x, y, params = data(**size)
    def plain(p, h):
        for w, b in p: h = jnp.tanh(h @ w + b)
        return h
    network = network or plain
    vg = jax.jit(jax.value_and_grad(lambda p, x, y: ((network(p, x) - y) ** 2).mean()))
    p, jx, jy = [(jnp.asarray(w), jnp.asarray(b)) for w, b in params], jnp.asarray(x), jnp.asarray(y)
    def step():
        value, grads = jax.block_until_ready(vg(p, jx, jy))
        return as_numpy(value, flat_grads(grads))
    return step

def jax_jit(size):
    jax, jnp = import_jax()
    return Contender(jax.__version__, {'step': jax_step(jax, jnp, size)}, note='jit: the pullback is not a separate call')

def hips_autograd(size):
    autograd, anp = import_autograd()
    from autograd import make_vjp
    x, y, params = data(**size)
    def loss(p):
        h = x
        for w, b in p: h = anp.tanh(h @ w + b)
        return ((h - y) ** 2).mean()
    def forward():
        pb, value = make_vjp(loss)([tuple(p) for p in params])
        return lambda: as_numpy(value, flat_grads(pb(np.float32(1))))
    return Contender(autograd_version(), {'step': lambda: forward()()}, forward={'step': forward})

CONTENDERS = {'fastad': fastad, 'numpy': hand_numpy, 'torch': lambda size: torch_eager(size)[0], 'jax': jax_jit,
              'autograd': hips_autograd}
