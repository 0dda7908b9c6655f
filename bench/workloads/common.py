"""What every workload module shares: a contender, a reason to skip one, the peers' imports, the same data everywhere."""
import os
from dataclasses import dataclass, field
import numpy as np

class Skip(Exception):
    "This contender cannot run here; the message says why (a peer not installed, a fastad feature not merged yet)."

@dataclass
class Contender:
    """One library's side of a workload: each case is a function to time; its first result is checked.
    A case returns (loss, [gradients]) as NumPy values, or None when it has nothing to check (a floor).
    `forward` cases (memory workloads) return the pullback to call, so held memory can be read in between."""
    version: str
    cases: dict
    gemm: object = None            # () -> None: one 1024^3 float32 matrix product in this library
    note: str = ''
    forward: dict = field(default_factory=dict)

def threads():
    return int(os.environ.get('FASTAD_BENCH_THREADS', '1'))

def numpy_gemm(n=1024):
    a = np.ones((n, n), np.float32); b = np.ones((n, n), np.float32)
    return lambda: a @ b

def import_torch():
    "PyTorch with the suite's thread count, or Skip when it is not installed."
    try: import torch
    except ImportError as e: raise Skip(f"PyTorch is not installed (pip install -e '.[bench]'): {e}")
    torch.set_num_threads(threads())
    try: torch.set_num_interop_threads(1)
    except RuntimeError: pass                       # already set in this process
    return torch

def torch_gemm(torch, n=1024):
    a = torch.ones((n, n)); b = torch.ones((n, n))
    return lambda: a @ b

def import_jax():
    "JAX on the CPU, or Skip when it is not installed."
    try:
        import jax, jax.numpy as jnp
    except ImportError as e: raise Skip(f"JAX is not installed (pip install -e '.[bench]'): {e}")
    return jax, jnp

def jax_gemm(jax, jnp, n=1024):
    a = jnp.ones((n, n), jnp.float32); b = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    return lambda: mm(a, b).block_until_ready()

def import_autograd():
    "HIPS autograd, or Skip when it is not installed."
    try:
        import autograd, autograd.numpy as anp
    except ImportError as e: raise Skip(f"HIPS autograd is not installed (pip install -e '.[bench]'): {e}")
    return autograd, anp

def autograd_version():
    from importlib.metadata import version
    return version('autograd')

def fastad_version():
    import fastad
    return fastad.__version__

def as_numpy(loss, grads):
    "(float loss, [float arrays]) from any library's values."
    return float(np.asarray(loss)), [np.asarray(g) for g in grads]
