"""Threads: each its own log, backend and trace_primitives object; gradients, replays and registrations in
one thread while another records."""
import threading
import numpy as np
import pytest
import fastad as fd
import sys
import contextvars
from fastad import engine, logs_and_collector as logs
from fastad.errors import FastADError
import time
from fastad import backend
from fastad.backend import to_device, to_host
from fastad.strict import StrictArray

def active_log():
    "The primitive log in force here and now, however the engine stores it (a module global or a context variable)."
    log = getattr(engine, '_log', None)
    return log.get(None) if hasattr(log, 'get') and not hasattr(log, 'record') else log



# ---- a checkpoint's replay holds the registry's lock only while it contests and settles its rules ------------------
# A checkpoint's replay holds the registry's lock only while it contests and settles its rules

def sin_of(x): return np.sin(x)

def test_another_threads_checkpointed_gradient_runs_during_a_replay():
    in_replay, done_other, waited, replaying = threading.Event(), threading.Event(), [], [False]
    def body(x):
        if replaying[0]:
            in_replay.set()
            waited.append(done_other.wait(5))     # a barrier between workers, say
        return sin_of(x)
    ck = fd.make_recomputed_in_gradient(body)
    pb = fd.pullback(lambda x: ck(x).sum(), np.ones(2))
    with fd.derivative(of=sin_of, vjp=lambda x: (np.sin(x), lambda g: 2 * g * np.cos(x))):   # registered after the forward pass
        def replay():
            replaying[0] = True
            pb(1.0)
        t = threading.Thread(target=replay); t.start()
        assert in_replay.wait(5)
        other, seen = fd.make_recomputed_in_gradient(lambda x: np.cos(x)), []
        u = threading.Thread(target=lambda: seen.append(fd.gradient(lambda x: other(x).sum(), np.ones(2))))
        u.start(); u.join(5)
        done_other.set(); t.join(10)
    assert waited == [True]                       # before: the other thread waited for the replay (5 s, False)
    np.testing.assert_allclose(seen[0], -np.sin(np.ones(2)))

def _replay_paused_in_another_thread():
    """A checkpointed pullback recorded under a rule (3 cos x) for `sin_of`, replaying in another thread and paused
    there until the `registered` event is set: (thread, registered, the list its gradient lands in)."""
    in_replay, registered, seen, replaying = threading.Event(), threading.Event(), [], [False]
    def body(x):
        if replaying[0]:
            in_replay.set()
            registered.wait(5)
        return sin_of(x)
    ck = fd.make_recomputed_in_gradient(body)
    with fd.derivative(of=sin_of, vjp=lambda x: (np.sin(x), lambda g: 3 * g * np.cos(x))):
        pb = fd.pullback(lambda x: ck(x).sum(), np.ones(2))
    def replay():
        replaying[0] = True
        seen.append(pb(1.0))
    t = threading.Thread(target=replay); t.start()
    assert in_replay.wait(5)
    return t, registered, seen

def test_a_registration_during_another_threads_replay_leaves_the_replay_its_rule():
    t, registered, seen = _replay_paused_in_another_thread()
    with fd.derivative(of=sin_of, vjp=lambda x: (np.sin(x), lambda g: 5 * g * np.cos(x))):
        registered.set(); t.join(10)
        np.testing.assert_allclose(fd.gradient(lambda x: sin_of(x).sum(), np.ones(2)), 5 * np.cos(1.))   # here: the new rule
    np.testing.assert_allclose(seen[0], 3 * np.cos(np.ones(2)))                                          # the replay: its own
    np.testing.assert_allclose(fd.gradient(lambda x: sin_of(x).sum(), np.ones(2)), np.cos(1.))          # all undone
    assert sin_of.__code__.co_name == 'sin_of' and sin_of.__kwdefaults__ is None

def test_a_first_registration_during_another_threads_replay_is_undone_cleanly():
    t, registered, seen = _replay_paused_in_another_thread()
    later = fd.derivative(of=sin_of, vjp=lambda x: (np.sin(x), lambda g: 5 * g * np.cos(x)))   # none was in force
    registered.set(); t.join(10)
    np.testing.assert_allclose(seen[0], 3 * np.cos(np.ones(2)))
    np.testing.assert_allclose(fd.gradient(lambda x: sin_of(x).sum(), np.ones(2)), 5 * np.cos(1.))
    later.undo()
    assert sin_of.__code__.co_name == 'sin_of' and sin_of.__kwdefaults__ is None
    np.testing.assert_allclose(fd.gradient(lambda x: sin_of(x).sum(), np.ones(2)), np.cos(1.))


# --- one trace_primitives object, nested and across threads ----------------------------------------------
def test_one_trace_primitives_object_nests():
    tp = fd.trace_primitives()
    with tp as outer:
        with tp as inner: fd.gradient(np.sin, 1.0)
        fd.gradient(np.cos, 1.0)
    assert outer is inner and outer.count('forward') == 2 and outer.count('pullback') == 2
    assert logs.LOG.get() is None and logs.opened == 0
    with tp: fd.gradient(np.exp, 1.0)                      # used again later: it opens again
    assert tp.log.count('forward') == 3

def test_a_closed_log_stays_closed_when_another_thread_opens_one():
    with fd.trace_primitives() as log:
        fd.gradient(np.sin, 1.0)
        inside = contextvars.copy_context()                # e.g. an asyncio task created inside the block
    assert log.count() == 2
    opened, done = threading.Event(), threading.Event()
    def other():
        with fd.trace_primitives():
            opened.set(); done.wait(10)
    worker = threading.Thread(target=other); worker.start(); opened.wait(10)
    try: inside.run(fd.gradient, np.sin, 1.0)              # runs with the closed log in its context
    finally: done.set(); worker.join()
    assert log.count() == 2, log

def test_one_log_open_in_another_thread_is_refused():
    tp, opened, done, errors = fd.trace_primitives(), threading.Event(), threading.Event(), []
    def other():
        with tp: opened.set(); done.wait(10)
    worker = threading.Thread(target=other); worker.start(); opened.wait(10)
    try:
        with pytest.raises(FastADError, match="open in another thread"):
            with tp: pass
    finally: done.set(); worker.join()
    assert logs.opened == 0 and logs.LOG.get() is None


# --- threads: each its own log and backend --------------------------------------------------------------------------
THREAD_JOBS = {            # name: (backend, function, input)
    'numpy-sin': ('numpy', lambda x: (np.sin(x) * x).sum(), np.linspace(0, 1, 5)),
    'strict-tanh': ('strict', lambda x: np.tanh(x @ x.T).mean(), np.arange(6.0).reshape(2, 3) / 10),
    'numpy-nested': ('numpy', lambda x: fd.gradient(lambda y: (y ** 3).sum(), x).sum(), np.ones(4)),
    'strict-lse': ('strict', lambda x: fd.logsumexp(x * 2.0, axis=0).sum(), np.arange(4.0)),
}

def run_job(name):
    "One job, single-threaded: its backend's array type, its gradient and its primitive counts."
    backend_name, f, x = THREAD_JOBS[name]
    with fd.use_backend(backend_name):
        with fd.trace_primitives() as log:
            time.sleep(0.0005)                                     # the others run meanwhile
            g = fd.gradient(f, to_device(x))
            used = backend.get_backend()
        return type(g), to_host(g), dict(log.counts), used

@pytest.mark.parametrize('switch_interval', [None, 1e-6])
def test_four_threads_differentiate_log_and_switch_backends_at_once(switch_interval):
    expected = {name: run_job(name) for name in THREAD_JOBS}
    assert expected['strict-tanh'][0] is StrictArray and expected['numpy-sin'][0] is np.ndarray
    results, errors = {name: [] for name in THREAD_JOBS}, []
    start = threading.Barrier(len(THREAD_JOBS))
    def work(name):
        try:
            start.wait()
            for _ in range(30): results[name].append(run_job(name))
        except Exception as e: errors.append((name, e))
    old = sys.getswitchinterval()
    if switch_interval: sys.setswitchinterval(switch_interval)
    try:
        threads = [threading.Thread(target=work, args=(name,)) for name in THREAD_JOBS]
        for t in threads: t.start()
        for t in threads: t.join(120)
    finally: sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    assert backend.get_backend() == 'numpy' and active_log() is None
    for name, runs in results.items():
        kind, g, counts, used = expected[name]
        for run_kind, run_g, run_counts, run_used in runs:
            assert (run_kind, run_used) == (kind, used), (name, run_kind, run_used)
            np.testing.assert_array_equal(run_g, g)
            assert run_counts == counts, (name, run_counts, counts)
