"""A checkpoint's replay recomputes under the derivatives of its forward pass in its own thread only: another thread differentiating meanwhile keeps the rules in force."""
import threading
import numpy as np, pytest
import fastad as fd


def _replay_while(other, plain_rule_gradient, use):
    """Record a checkpointed `use` under the rules in force now; let the caller register a new rule; then run the
    pullback in one thread, pausing inside its replay while `other()` runs in a second thread. Returns (the
    replay's gradient, what `other` returned, the gradient `use` had inside the replay)."""
    in_replay, go_on, replaying = threading.Event(), threading.Event(), [False]
    seen = {}
    def body(x):
        if replaying[0]:
            seen['inside'] = fd.gradient(lambda x: use(x).sum(), fd.without_derivative(x))   # the replay's own rule
            in_replay.set()
            assert go_on.wait(10)
        return use(x)
    x = np.array([0.3, 1.2])
    pb = fd.pullback(fd.make_recomputed_in_gradient(body), x)
    return pb, x, in_replay, go_on, replaying, seen

def _run(pb, x, in_replay, go_on, replaying, other):
    out = {}
    def replay():
        replaying[0] = True
        out['replay'] = pb(np.ones(2))
    t = threading.Thread(target=replay)
    t.start()
    try:
        assert in_replay.wait(10)
        out['other'] = other(x)                                      # runs while the replay is paused
    finally:
        go_on.set()
        t.join(10)
    return out

def test_numpy_rule_registered_after_the_forward_pass():
    pb, x, in_replay, go_on, replaying, seen = _replay_while(None, None, np.sin)
    new_rule = lambda x: (np.sin(x), lambda g: 100 * g)
    with fd.derivative(of=np.sin, vjp=new_rule):                     # registered after the forward pass
        out = _run(pb, x, in_replay, go_on, replaying, lambda x: fd.gradient(lambda x: np.sin(x).sum(), x))
        np.testing.assert_allclose(out['other'], [100., 100.])     # the other thread: the new rule
        np.testing.assert_allclose(out['replay'], np.cos(x))        # the replay: the rule of its forward pass
        np.testing.assert_allclose(seen['inside'], np.cos(x))
        np.testing.assert_allclose(fd.gradient(lambda x: np.sin(x).sum(), x), [100., 100.])   # and afterwards
    np.testing.assert_allclose(fd.gradient(lambda x: np.sin(x).sum(), x), np.cos(x))

def test_python_function_rule_registered_after_the_forward_pass():
    def cube(x): return x ** 3
    pb, x, in_replay, go_on, replaying, seen = _replay_while(None, None, cube)
    with fd.derivative(of=cube, vjp=lambda x: (cube(x), lambda g: 100 * g)):
        out = _run(pb, x, in_replay, go_on, replaying, lambda x: fd.gradient(lambda x: cube(x).sum(), x))
        np.testing.assert_allclose(out['other'], [100., 100.])
        np.testing.assert_allclose(out['replay'], 3 * x ** 2)
        np.testing.assert_allclose(seen['inside'], 3 * x ** 2)
        np.testing.assert_allclose(fd.gradient(lambda x: cube(x).sum(), x), [100., 100.])
    np.testing.assert_allclose(fd.gradient(lambda x: cube(x).sum(), x), 3 * x ** 2)

def test_rule_undone_after_the_forward_pass():
    "The other way round: the forward pass ran under a custom rule, undone before the backward pass."
    registration = fd.derivative(of=np.tanh, vjp=lambda x: (np.tanh(x), lambda g: 7 * g))
    try:
        pb, x, in_replay, go_on, replaying, seen = _replay_while(None, None, np.tanh)
    finally:
        registration.undo()
    out = _run(pb, x, in_replay, go_on, replaying, lambda x: fd.gradient(lambda x: np.tanh(x).sum(), x))
    np.testing.assert_allclose(out['other'], 1 - np.tanh(x) ** 2)  # nothing registered, for the other thread
    np.testing.assert_allclose(out['replay'], [7., 7.])
    assert fd.registered_derivative(np.tanh) is None and np.tanh not in fd.primitives.REGISTRY or \
        fd.primitives.REGISTRY[np.tanh].custom is None

def test_nothing_contested_after_replays():
    from fastad import transforms
    def square(x): return x * x
    pb = fd.pullback(fd.make_recomputed_in_gradient(square), np.ones(2))
    with fd.derivative(of=square, vjp=lambda x: (square(x), lambda g: 5 * g)):
        np.testing.assert_allclose(pb(np.ones(2)), [2., 2.])
        assert not transforms._CONTESTED and fd.primitives.CONTEXT_RULES.get() is None
        np.testing.assert_allclose(fd.gradient(lambda x: square(x).sum(), np.ones(2)), [5., 5.])
    assert type(fd.primitives.REGISTRY[np.add]) is fd.primitives.Entry
