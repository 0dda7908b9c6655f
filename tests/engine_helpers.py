"""Helpers several test files share: what the engine holds between transforms, and a numerical Jacobian."""
import contextlib, gc, weakref
import numpy as np
from fastad import engine, backend, logs_and_collector
from fastad.primitives import REGISTRY

def active_log():
    "The primitive log in force here and now (a context variable of fastad.logs_and_collector)."
    return logs_and_collector.LOG.get()

def live_traces():
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is engine.Recording]

def engine_state():
    "What a transform may change only while it runs: the log, the backend, the registries and the adapters."
    rows = {f: (row.primitive, row.adapt, row.rule, row.custom) for f, row in REGISTRY.items()}
    return (active_log(), backend.get_backend(), rows,
            sum(t.active for t in live_traces()))

@contextlib.contextmanager
def collector_off():
    "Reference counting only, inside the block."
    was = gc.isenabled()
    gc.disable()
    try: yield
    finally:
        if was: gc.enable()

def saved_by_the_tape(kept, x):
    "exp(x), with a weak reference to the array exp's pullback saves (its result) put in `kept`."
    h = np.exp(x)
    value = h
    while engine.is_traced(value): value = value.value
    kept.append(weakref.ref(value))
    return h

# fastad.testing.numerical_gradient takes scalar functions only; these tests need Jacobians of vector-valued ones.
def numerical_jacobian(f, x, eps=1e-6):
    "Central differences of f at vector x, column by column (f gets a fresh copy each time): f's shape, then x's."
    columns = []
    for i in range(len(x)):
        up, down = x.copy(), x.copy()
        up[i] += eps; down[i] -= eps
        columns.append((np.asarray(f(up)) - np.asarray(f(down))) / (2 * eps))
    return np.stack(columns, axis=-1)
