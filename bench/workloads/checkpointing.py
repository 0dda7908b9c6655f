"""Workload 5: lesson 07's gradient checkpointing on workload 4's network: held and peak memory, and step time,
with no checkpoints, with √n segments and with every layer a segment.

Segments follow torch.utils.checkpoint.checkpoint_sequential: n // segments layers each, the last segment takes the
rest and is not checkpointed (its activations are needed at once by the backward pass). JAX gets the same segments,
each but the last wrapped in jax.checkpoint, under jit."""
import math
import numpy as np
from .common import Contender, Skip, as_numpy, import_torch, import_jax, fastad_version
from . import memory

TITLE = '{layers} × (Dense {width} + tanh), batch {batch}: checkpointing'
UNIT, SCALE = 'MiB', 1 / 2**20
CASES = ('none', 'sqrt', 'every')
KIND = 'memory+time'
TIME_UNIT, TIME_SCALE = 'ms', 1e3
ROUNDS = 5                            # each step takes a second or more
sizes = memory.sizes

def segment_count(case, layers):
    return {'none': 1, 'sqrt': round(math.sqrt(layers)), 'every': layers}[case]

def segments(layers, count):
    "(start, stop, checkpointed) of each segment, as checkpoint_sequential splits them."
    size = layers // count
    cuts = [(i * size, (i + 1) * size, True) for i in range(count - 1)]
    return cuts + [((count - 1) * size, layers, False)]

def fastad(size):
    import fastad as fd
    from fastad.tree import flatten
    if not hasattr(fd, 'checkpoint_sequential'):
        raise Skip('fd.checkpoint_sequential is not in this fastad yet (lesson 07)')
    x, y, params = memory.data(**size)
    layers = [fd.Dense(weight=w, bias=b, activation=np.tanh) for w, b in params]
    def make(case):
        model = layers if case == 'none' else fd.checkpoint_sequential(layers, segments=segment_count(case, len(layers)))
        run = (lambda m: fd.sequenced(x, through=m)) if case == 'none' else (lambda m: m(x))
        def forward():
            value, pb = fd.value_with_pullback(lambda m: ((run(m) - y) ** 2).mean(), model)
            return lambda: as_numpy(value, flatten(pb(np.float32(1)), where='the gradient', static_ok=True)[0])
        return forward
    try:
        forwards = {case: make(case) for case in CASES}
        for f in forwards.values(): f()()
    except Exception as e:
        raise Skip(f"fd.checkpoint_sequential is there but the suite's call does not fit it: {type(e).__name__}: {e}")
    return Contender(fastad_version(), {c: (lambda f=f: f()()) for c, f in forwards.items()}, forward=forwards)

def torch_eager(size):
    torch = import_torch()
    from torch.utils.checkpoint import checkpoint_sequential
    base, torch, model, tx = memory.torch_eager(size)
    x, y, params = memory.data(**size)
    ty = torch.from_numpy(y)
    def make(case):
        count = segment_count(case, len(model))
        run = model if case == 'none' else (lambda t: checkpoint_sequential(model, count, t, use_reentrant=False))
        def forward():
            model.zero_grad(set_to_none=True)
            loss = ((run(tx) - ty) ** 2).mean()
            def backward():
                loss.backward()
                return as_numpy(loss.detach(), memory.torch_grads(model))
            return backward
        return forward
    forwards = {case: make(case) for case in CASES}
    return Contender(torch.__version__, {c: (lambda f=f: f()()) for c, f in forwards.items()}, forward=forwards)

def jax_jit(size):
    jax, jnp = import_jax()
    def network_for(case):
        def network(p, h):
            for start, stop, saved in segments(len(p), segment_count(case, len(p))):
                def segment(q, h):
                    for w, b in q: h = jnp.tanh(h @ w + b)
                    return h
                h = (jax.checkpoint(segment) if saved and case != 'none' else segment)(p[start:stop], h)
            return h
        return network
    return Contender(jax.__version__, {c: memory.jax_step(jax, jnp, size, network_for(c)) for c in CASES},
                     note='jit: the pullback is not a separate call')

CONTENDERS = {'fastad': fastad, 'torch': torch_eager, 'jax': jax_jit}
