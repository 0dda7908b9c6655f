"""Fixes from the review of merged work: each test failed before its fix."""
import gc, threading, weakref
import numpy as np
import pytest
import fastad as fd

@pytest.fixture
def collector_settings():
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

def test_cycles_made_while_recording_are_collected_during_a_long_recording(collector_settings):
    refs = []
    alive = cycles_alive_while_recording(20_000, refs)
    assert alive < 5_000, alive                   # 20,000 with the collector off

def test_cycles_stay_bounded_while_threads_record_at_once(collector_settings):
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
    assert max(counts) < 5_000, counts
    assert gc.get_threshold() == collector_settings and gc.isenabled()

def test_the_users_gc_disable_inside_f_survives(collector_settings):
    def f(x):
        gc.disable()                              # the user's own choice, made while recording
        return np.sin(x)
    fd.gradient(f, 1.0)
    assert not gc.isenabled()
    assert gc.get_threshold() == collector_settings

