"""The engine spaces young collections out and pauses full ones while a tape is recorded or swept, and restores
the thresholds afterwards: after errors, nested transforms, several threads; the thresholds and changes the user made meanwhile stand."""
import gc, threading
import numpy as np
import pytest
import fastad as fd
from fastad.engine import collector_tuned_for_tapes

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
