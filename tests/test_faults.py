"""Faults: an exception or a Ctrl-C (KeyboardInterrupt) anywhere in a forward or backward pass, or in the engine's
critical sections, leaves nothing behind: no log, no tape, no registration, the collector as it was."""
import gc, linecache, sys
import numpy as np, pytest
import fastad as fd
from fastad import engine, transforms, logs_and_collector as logs
import weakref
from fastad import backend
from fastad.primitives import REGISTRY

from engine_helpers import active_log, live_traces, engine_state, collector_off, saved_by_the_tape




# --- a KeyboardInterrupt at each line of the critical sections -------------------------------------------
class Interrupt:
    """Raise KeyboardInterrupt at the `n`-th line that runs in any of `codes` (then stop: a trace function that
    raises is switched off, so each run gets exactly one interrupt). `.site` is where it landed.
    A line seen again in the same call is skipped: these functions have no loops, so that is a `with` line's second
    event, just before its lock is released, where a real Ctrl-C cannot land (CPython runs signal handlers at calls
    and backward jumps; the release is the next call, and the lock is free once it returns).
    A site is `(function, line, within)`: `within` names every function on the stack there, callers included."""
    def __init__(self, codes, n): self.codes, self.n, self.seen, self.site, self.lines = set(codes), n, 0, None, set()
    def __call__(self, frame, event, arg):
        if frame.f_code not in self.codes: return None
        if event == 'line':
            if (id(frame), frame.f_lineno) in self.lines: return self
            self.lines.add((id(frame), frame.f_lineno))
            self.seen += 1
            if self.seen == self.n:
                within, f = set(), frame
                while f is not None: within.add(f.f_code.co_name); f = f.f_back
                self.site = (frame.f_code.co_name, linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip(),
                             frozenset(within))
                raise KeyboardInterrupt
        return self
    def run(self, fn):
        sys.settrace(self)
        try: fn()
        except KeyboardInterrupt: pass
        finally: sys.settrace(None)
        return self.site

def code_of(*objs):
    return [o.__code__ for o in objs]

def part(owner, name):
    "A function the critical section is split into; gone (renamed, merged), the test must be told what to trace instead."
    if not callable(getattr(owner, name, None)):
        pytest.fail(f"{getattr(owner, '__name__', owner)}.{name} is gone: trace the functions the critical section now runs")
    return getattr(owner, name)

def each_interrupt(codes, fn, check, limit=200):
    "Run `fn` once per line it runs in `codes`, interrupted there; `check(site)` after each. Returns the sites."
    sites = []
    for n in range(1, limit):
        site = Interrupt(codes, n).run(fn)
        check(site)
        if site is None: return sites                    # ran to the end: every line has had its turn
        sites.append(site)
    raise AssertionError("too many lines")

def in_the_exit(site):
    """Did the interrupt land in `__exit__` (or in what it calls)? Then it may leave the block whole (still open), as
    one that came just before the exit was called would; the caller checks that it is whole, never half closed.
    An interrupt anywhere else (in `__enter__` too, whose exit never runs) must leave nothing behind."""
    return '__exit__' in site[2]

def test_an_interrupt_anywhere_in_trace_primitives_leaves_no_log_behind():
    tp_cls = logs.trace_primitives
    codes = code_of(tp_cls.__enter__, tp_cls.__exit__, part(tp_cls, '_open'), part(tp_cls, '_close'), logs._open_logs)
    def check_clean(tp, site):
        assert (logs.LOG.get(), logs.opened) == (None, 0), site
        assert not logs._open_blocks and not tp._blocks and tp.log.closed
    state = {}
    def block():
        state['tp'] = tp = fd.trace_primitives()
        with tp: pass
    def check(site):
        tp = state['tp']
        if logs.LOG.get() is tp.log and in_the_exit(site):
            assert logs.opened == 1 and len(tp._blocks) == 1     # whole: still open, nothing half undone
            tp.__exit__(None, None, None)
        check_clean(tp, site)
    sites = each_interrupt(codes, block, check)
    assert {s[0] for s in sites} >= {'__enter__', '__exit__', '_open', '_close', '_open_logs'}, sites

def test_an_interrupt_anywhere_in_collector_tuned_for_tapes_leaves_the_collector_as_it_was():
    fcp = logs.collector_tuned_for_tapes
    codes = code_of(fcp.__enter__, fcp.__exit__, part(logs, '_count_tapes'), part(logs, '_set_tapes'))
    threshold = gc.get_threshold()
    def check(site):
        if logs._collector_users == 1 and in_the_exit(site):
            assert gc.get_threshold() != threshold                      # whole: still tuned, and counted
            logs.collector_tuned_for_tapes().__exit__(None, None, None)
        assert logs._collector_users == 0 and gc.isenabled() and gc.get_threshold() == threshold, site
    def block():
        with fcp(): pass
    sites = each_interrupt(codes, block, check)
    assert any(s[0] == '_set_tapes' for s in sites), sites
    assert fd.gradient(np.sin, 0.0) == 1.0 and gc.isenabled() and gc.get_threshold() == threshold

def square(x): return x * x

@pytest.mark.parametrize('form', ['decorator', 'call'])
@pytest.mark.parametrize('of', [square, np.sin], ids=['python function', 'ufunc'])
def test_an_interrupt_anywhere_in_derivative_leaves_no_registration_without_a_handle(form, of):
    codes = code_of(fd.derivative, transforms._register, transforms._redirection, transforms.Registration.undo,
                    transforms._Redirection.push, transforms._Redirection.remove, transforms.differentiable_function)
    codes += code_of(fd.derivative(of=of))                          # the decorator it returns (registers nothing yet)
    for cls in (transforms._PythonFunctionRedirection, transforms._RegistryRedirection):
        codes += code_of(cls.__init__, cls.install, cls.restore)
    original = of.__code__ if of is square else transforms.REGISTRY[of].rule
    got = {}
    def vjp(x): return x * x, lambda g: 3 * g
    def register():
        got.clear()
        if form == 'call': got['handle'] = fd.derivative(of=of, vjp=vjp)
        else: got['handle'] = fd.derivative(of=of)(vjp)
    def check(site):
        reg = fd.registered_derivative(of)
        if 'handle' in got:                                         # it returned: the rule is in force, with its handle
            assert reg is not None and (reg is got['handle'] or reg.vjp is got['handle'])
            assert fd.gradient(lambda x: of(x), 2.0) == 3.0
            reg.undo()
        assert fd.registered_derivative(of) is None and id(of) not in transforms._REDIRECTIONS, site
        assert (of.__code__ if of is square else transforms.REGISTRY[of].rule) is original, site
        assert fd.gradient(lambda x: of(x), 2.0) == pytest.approx(4.0 if of is square else np.cos(2.0)), site
    sites = each_interrupt(codes, register, check)
    assert any(s[0] == 'push' for s in sites) and any(s[0] in ('_register', 'register') for s in sites)


# --- an exception in the middle leaves nothing behind -------------------------------------------------------------
class Boom(Exception): pass

def test_exception_in_the_middle_of_a_forward_pass():
    before = engine_state()
    kept = []
    def f(x):
        h = saved_by_the_tape(kept, x) * x
        if True: raise Boom("forward")
        return h.sum()
    with collector_off():
        try: fd.gradient(f, np.ones(100))
        except Boom: pass
        assert kept[0]() is None                                   # the half-built tape is gone
    assert engine_state() == before
    np.testing.assert_allclose(fd.gradient(lambda x: (np.exp(x) * x).sum(), np.ones(3)), 2 * np.e)

def test_exception_in_the_forward_pass_inside_a_log_and_a_backend_block(any_backend):
    outer_backend = backend.get_backend()
    try:
        with fd.trace_primitives() as log, fd.use_backend('numpy'):
            fd.gradient(lambda x: (np.sin(x), 1 / 0)[0], 1.0)
    except ZeroDivisionError: pass
    assert active_log() is None and backend.get_backend() == outer_backend
    assert log.count('forward', 'sin') == 1 and log.count('pullback') == 0
    assert fd.gradient(np.sin, 0.0) == 1.0 and log.count() == 1    # the closed log records nothing more

def test_exception_in_a_nested_forward_pass():
    before = engine_state()
    def f(x): return fd.gradient(lambda y: (x * y, 1 / 0)[0], 2.0) * x
    with pytest.raises(ZeroDivisionError): fd.gradient(f, 3.0)
    assert engine_state() == before
    assert fd.gradient(lambda x: fd.gradient(lambda y: x * y * y, 2.0) * x, 3.0) == 24.0

def test_exception_in_a_custom_pullback():
    before = engine_state()
    kept, calls = [], []
    @fd.differentiable_function
    def fragile(x):
        ans = np.sin(x)
        kept.append(weakref.ref(ans))
        def pullback(g):
            calls.append(1)
            raise Boom("backward")
        return ans, pullback
    with collector_off():
        try: fd.gradient(lambda x: (fragile(x * 2.0) * x).sum(), np.ones(100))
        except Boom: pass
        assert calls == [1]
    gc.collect()                                                   # the raised exception's frames are gone now
    assert kept[0]() is None
    assert engine_state() == before
    np.testing.assert_allclose(fd.gradient(lambda x: np.sin(x * 2.0).sum(), np.zeros(3)), 2.0)

def test_exception_in_a_hook_in_a_nested_backward_pass():
    before = engine_state()
    def hook(g): raise Boom("hook")
    def f(x): return fd.gradient(lambda y: (fd.with_derivative(y * x, hook) ** 2).sum(), np.ones(3)).sum()
    with pytest.raises(Boom): fd.gradient(f, np.ones(3))
    assert engine_state() == before                                # the outer trace is closed too
    np.testing.assert_allclose(fd.gradient(lambda x: fd.gradient(lambda y: ((y * x) ** 2).sum(), np.ones(3)).sum(),
                                           np.full(3, 2.0)), 8.0)

def test_exception_in_the_backward_pass_inside_a_log():
    def hook(g): raise Boom("hook")
    with pytest.raises(Boom):
        with fd.trace_primitives() as log: fd.gradient(lambda x: fd.with_derivative(np.exp(x), hook), 1.0)
    assert active_log() is None and log.count('forward') == 2
    assert fd.gradient(np.exp, 0.0) == 1.0
