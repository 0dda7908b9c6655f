"""Workload 2: chains of scalar operations, forward and backward, in µs per operation.

Three chains of 1,000 operations on Python floats (float64), and the first one again on longer tapes:
* mixed:    sin, × 0.5, + 0.1, exp, 250 times (the classic chain);
* constant: × 0.999, + 0.001, 500 times: every operation has a Python constant as its second operand;
* traced:   x × x, then + y, 500 times: both operands of every operation are traced."""
import gc, math
import numpy as np
from .common import Contender, Skip, import_torch, import_autograd, autograd_version, fastad_version

TITLE = 'scalar ops, fwd+bwd'
UNIT, SCALE = 'µs/op', 1e6
X0, Y0 = 0.3, 0.2

def sizes(quick): return dict(lengths=(1_000, 3_000) if quick else (1_000, 30_000, 300_000))

def cases(size):
    "Case name -> number of operations."
    return {'mixed': 1_000, 'constant': 1_000, 'traced': 1_000,
            **{f'tape {n:,}': n for n in size['lengths'] if n != 1_000}}

def program(case):
    "(function of x, or of (x, y), written against `lib` (numpy-like), number of arguments) for a case."
    if case == 'constant':
        def f(x, lib):
            for _ in range(500): x = x * 0.999; x = x + 0.001
            return x
        return f, 1
    if case == 'traced':
        def f(x, y, lib):
            for _ in range(500): x = x * x; x = x + y        # x² + y: settles near 0.28, never overflows
            return x
        return f, 2
    n = 1_000 if case == 'mixed' else int(case.split()[-1].replace(',', ''))
    def f(x, lib):
        for _ in range(n // 4): x = lib.exp(lib.sin(x) * 0.5 + 0.1)
        return x
    return f, 1

def _bind(case, lib):
    f, arity = program(case)
    return (lambda x: f(x, lib)) if arity == 1 else (lambda x, y: f(x, y, lib)), arity

def _check(value, grads): return float(value), [float(g) for g in grads]

def fastad(size, gc_off=False):
    import fastad as fd
    def make(case):
        f, arity = _bind(case, np)
        vg = lambda: fd.value_with_gradient(f, *(X0, Y0)[:arity])
        def run():
            if gc_off: gc.disable()
            try: value, grads = vg()
            finally:
                if gc_off: gc.enable()
            return _check(value, grads if arity > 1 else (grads,))
        return run
    cases_ = {c: make(c) for c in cases(size) if not gc_off or c.startswith('tape') or c == 'mixed'}
    return Contender(fastad_version(), cases_, note='gc disabled during each call' if gc_off else '')

class _Scalar:
    "A minimal pure-Python scalar tape (micrograd-style): the least a tape written in Python can cost."
    __slots__ = ('data', 'grad', 'parents')
    tape = []
    def __init__(self, data, parents=()):
        self.data, self.grad, self.parents = data, 0.0, parents
        _Scalar.tape.append(self)
    def __mul__(self, o):
        if type(o) is _Scalar: return _Scalar(self.data * o.data, ((self, o.data), (o, self.data)))
        return _Scalar(self.data * o, ((self, o),))
    def __add__(self, o):
        if type(o) is _Scalar: return _Scalar(self.data + o.data, ((self, 1.0), (o, 1.0)))
        return _Scalar(self.data + o, ((self, 1.0),))

class _ScalarMath:
    "sin and exp of a _Scalar, so the chains run unchanged."
    @staticmethod
    def sin(x): return _Scalar(math.sin(x.data), ((x, math.cos(x.data)),))
    @staticmethod
    def exp(x):
        e = math.exp(x.data)
        return _Scalar(e, ((x, e),))

def _tape_gradient(f, args):
    _Scalar.tape = []
    leaves = [_Scalar(a) for a in args]
    out = f(*leaves)
    out.grad = 1.0
    for v in reversed(_Scalar.tape):                  # creation order is a topological order: walk it backwards
        for p, local in v.parents: p.grad += local * v.grad
    return out.data, [l.grad for l in leaves]

def python_tape(size):
    def make(case):
        f, arity = _bind(case, _ScalarMath)
        return lambda: _check(*_tape_gradient(f, (X0, Y0)[:arity]))
    import platform
    return Contender(f"CPython {platform.python_version()}", {c: make(c) for c in cases(size)},
                     note='a minimal pure-Python tape written in the suite')

def plain_forward(size):
    "The chains on Python floats with no derivative at all: a floor."
    def make(case):
        f, arity = _bind(case, np)
        return lambda: f(*(X0, Y0)[:arity]) and None
    return Contender(np.__version__, {c: make(c) for c in cases(size)})

def torch_eager(size):
    torch = import_torch()
    def make(case):
        f, arity = _bind(case, torch)
        def run():
            leaves = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (X0, Y0)[:arity]]
            out = f(*leaves)
            out.backward()
            return _check(out.detach(), [l.grad for l in leaves])
        return run
    return Contender(torch.__version__, {c: make(c) for c in cases(size)})

def hips_autograd(size):
    autograd, anp = import_autograd()
    def make(case):
        f, arity = _bind(case, anp)
        vg = autograd.value_and_grad(f, tuple(range(arity))) if arity > 1 else autograd.value_and_grad(f)
        def run():
            value, grads = vg(*(X0, Y0)[:arity])
            return _check(value, grads if arity > 1 else (grads,))
        return run
    return Contender(autograd_version(), {c: make(c) for c in cases(size)})

def jax_na(size):
    raise Skip('not measured: jit compiles a scalar chain into one kernel (compile time dominates) and eager JAX '
               'dispatches each scalar op to XLA; neither is the tape this row measures')

CONTENDERS = {'fastad': fastad, 'fastad, gc off': lambda size: fastad(size, gc_off=True), 'numpy': python_tape,
              'torch': torch_eager, 'jax': jax_na, 'autograd': hips_autograd, 'floor': plain_forward}
FLOOR_NOTE = 'the chain with no derivative'

def rounds_for(case, rounds):
    "Long tapes take seconds a call: fewer rounds for them."
    n = cases_ops(case)
    return rounds if n <= 1_000 else max(2, min(rounds, 5 if n < 100_000 else 3))

def cases_ops(case): return 1_000 if not case.startswith('tape') else int(case.split()[-1].replace(',', ''))
GAP = 0                                # scalar chains start no BLAS or OpenMP threads: no need to let them settle
ROUNDS = 25
