"""The engine spaces young collections out and pauses full ones while a tape is recorded or swept, and restores
the thresholds afterwards: after errors, nested transforms, several threads; the thresholds and changes the user made meanwhile stand.
Cycles made while recording are still collected, and memory stays flat over 10,000 steps."""
import gc, threading
import numpy as np
import pytest
import fastad as fd
from fastad.logs_and_collector import collector_tuned_for_tapes
import weakref

def tuned(found): return (found[0] and max(found[0], 20_000), max(found[1], 100), max(found[2], 1 << 30))

@pytest.fixture(autouse=True)
def collector_settings():
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)
    gc.enable()

def test_paused_while_recording_and_sweeping_then_restored(collector_settings):
    seen = []
    def f(x):
        seen.append((gc.isenabled(), gc.get_threshold()))
        return np.sin(x) * 2.0
    fd.value_with_gradient(f, 0.3)
    assert seen == [(True, tuned(collector_settings))]  # still on, young collections spaced, full ones paused
    assert gc.get_threshold() == collector_settings
    assert gc.isenabled()

def test_a_later_pullback_pauses_its_sweep():
    seen = []
    def cube_vjp(x):
        def pullback(g):
            seen.append(gc.get_threshold())
            return 3 * x ** 2 * g
        return x ** 3, pullback
    cube = fd.differentiable_function(cube_vjp, name='cube')
    value, pb = fd.value_with_pullback(cube, 2.0)
    assert gc.isenabled()                         # between the passes, the collector is as it was
    assert pb(1.0) == pytest.approx(12.0)
    assert seen == [tuned(gc.get_threshold())]

def test_restored_after_an_error_in_the_function(collector_settings):
    def f(x): raise ValueError("boom")
    with pytest.raises(ValueError, match="boom"): fd.gradient(f, 1.0)
    assert gc.get_threshold() == collector_settings and gc.isenabled()

def test_nested_transforms_restore_once_at_the_outermost(collector_settings):
    inner = []
    def f(x):
        g = fd.gradient(lambda y: y ** 3, x)
        inner.append(gc.get_threshold())          # still tuned after the inner transform returned
        return g
    assert fd.gradient(f, 2.0) == pytest.approx(12.0)
    assert inner == [tuned(collector_settings)]
    assert gc.get_threshold() == collector_settings and gc.isenabled()

def test_the_users_own_change_stands(collector_settings):
    def f(x):
        gc.set_threshold(500, 5, 7)               # the user's code tunes the collector in the middle
        return x * x
    fd.gradient(f, 1.0)
    assert gc.get_threshold() == (500, 5, 7) and gc.isenabled()

def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    fd.gradient(lambda x: np.sin(x), 1.0)
    assert not gc.isenabled()
    def g(x):
        assert not gc.isenabled()                 # off while recording too
        return x * x
    fd.gradient(g, 1.0)
    assert not gc.isenabled()
    def f(x):
        gc.enable()                               # turned on by the user's code: it stays on
        return x * x
    fd.gradient(f, 1.0)
    assert gc.isenabled()

def test_many_threads_leave_the_settings_as_they_found_them(collector_settings):
    errors = []
    def work():
        try:
            for _ in range(200): fd.gradient(lambda x: np.tanh(x).sum(), np.ones(3))
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors
    assert gc.get_threshold() == collector_settings and gc.isenabled()

def test_the_context_manager_alone_nests():
    before = gc.get_threshold()
    with collector_tuned_for_tapes():
        with collector_tuned_for_tapes(): assert gc.get_threshold() == tuned(before)
        assert gc.get_threshold() == tuned(before)
    assert gc.get_threshold() == before and gc.isenabled()

def test_young_garbage_is_still_collected_while_recording():
    import weakref
    class Node: pass
    refs = []
    def f(x):
        a, b = Node(), Node()
        a.other, b.other = b, a                   # a cycle, dropped at once
        refs.append(weakref.ref(a))
        del a, b
        gc.collect(0)                             # a young collection, as the allocator would run
        return x * 2.0
    fd.gradient(f, 1.0)
    assert refs[0]() is None


# ---- cycles made while recording are collected; the user's own gc settings survive ---------------------------------
@pytest.fixture
def collector_enabled():
    before, on = gc.get_threshold(), gc.isenabled()
    gc.enable()
    yield before
    gc.set_threshold(*before)
    (gc.enable if on else gc.disable)()

class Node: pass

def cycles_alive_while_recording(n, refs):
    "Record n operations, each making and dropping a reference cycle; how many of them are alive at the end."
    def f(x):
        for _ in range(n):
            a, b = Node(), Node()
            a.other, b.other = b, a
            refs.append(weakref.ref(a))
            del a, b
            x = x * 1.0
        alive.append(sum(r() is not None for r in refs))
        return x
    alive = []
    fd.gradient(f, 1.0)
    return alive[0]

def test_cycles_made_while_recording_are_collected_during_a_long_recording(collector_enabled):
    refs = []
    alive = cycles_alive_while_recording(20_000, refs)
    assert alive < 5_000, alive                   # 20,000 with the collector off

def test_cycles_stay_bounded_while_threads_record_at_once(collector_enabled):
    counts, errors, go = [], [], threading.Barrier(3)
    def work():
        try:
            go.wait()
            for _ in range(3): counts.append(cycles_alive_while_recording(10_000, []))
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors and len(counts) == 9
    assert sum(counts) < 45_000, counts           # all 90,000 with the collector off; one round may catch a high tide
    assert gc.get_threshold() == collector_enabled and gc.isenabled()

def test_the_users_gc_disable_inside_f_survives(collector_enabled):
    def f(x):
        gc.disable()                              # the user's own choice, made while recording
        return np.sin(x)
    fd.gradient(f, 1.0)
    assert not gc.isenabled()
    assert gc.get_threshold() == collector_enabled


# ---- the collector waits while a tape is in use ----

class _Node:
    "An object in a reference cycle, as user code makes them."
    def __init__(self): self.other = None

@pytest.mark.slow   # 10,000 steps; test_few_young_and_no_full_collections_while_recording checks the settings
def test_memory_stays_flat_and_user_cycles_are_collected_over_10000_steps():
    import tracemalloc, weakref
    assert gc.isenabled()
    alive = weakref.WeakSet()                         # the cycles not collected yet
    def f(x):
        a, b = _Node(), _Node()
        a.other, b.other = b, a                       # a cycle, dropped when f returns
        alive.add(a)
        return (np.sin(x) * x).sum()
    x = np.ones(3)
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(1_000): fd.gradient(f, x)
        early = tracemalloc.get_traced_memory()[0]
        for _ in range(9_000): fd.gradient(f, x)
        late = tracemalloc.get_traced_memory()[0]
    finally: tracemalloc.stop()
    assert gc.isenabled()                             # the collector is on between steps
    assert late - early < 64 * 1024, (early, late)    # 9,000 more steps: no more memory (each cycle is ~0.3 KiB)
    assert len(alive) < 1_000, len(alive)             # the automatic collections freed them, with no gc.collect()

def test_few_young_and_no_full_collections_while_recording():
    runs = []
    count = lambda phase, info: runs.append(info['generation']) if phase == 'start' else None
    def f(x):
        for _ in range(20_000): x = np.sin(x)         # 20,000 entries: with the default thresholds, hundreds of collections
        return x
    gc.callbacks.append(count)
    try: fd.gradient(f, 0.3)
    finally: gc.callbacks.remove(count)
    assert 2 not in runs and len(runs) < 40, runs       # young ones every 20,000 new objects; full ones paused
