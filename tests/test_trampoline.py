"""`fastad.trampoline`: the code-object trampoline of `derivative(of=f)` for plain Python functions, on the Python
that runs the tests (CONTRIBUTING.md runs these on 3.10 and 3.13 too; Python 3.11 changed the line table)."""
import inspect, linecache, sys, traceback
import numpy as np, pytest
import fastad as fd
from fastad.trampoline import _trampoline, _labelled_like


def scaled(x, factor=2.0, *, shift=0.0):
    "A plain function with a default and a keyword-only argument."
    return x * factor + shift

def make_closure(n):
    "A function with `n` free variables."
    a, b, c = 1.0, 2.0, 3.0
    if n == 0: return lambda x: x * 2
    if n == 1: return lambda x: x * a
    return lambda x: x * a * b * c

@pytest.mark.parametrize('n', [0, 1, 3])
def test_trampoline_fits_any_closure(n):
    f = make_closure(n)
    assert len(_trampoline(len(f.__code__.co_freevars)).co_freevars) == len(f.__code__.co_freevars)
    plain = fd.gradient(lambda x: f(x), 1.5)
    with fd.derivative(of=f, vjp=lambda x: (f(x), lambda g: 10 * g)):
        assert fd.gradient(lambda x: f(x), 1.5) == 10.0
        assert f(1.5) == make_closure(n)(1.5)                 # outside a transform: the function's own value
    assert fd.gradient(lambda x: f(x), 1.5) == plain

def test_defaults_keywords_signature_and_source_survive():
    before = (inspect.signature(scaled), inspect.getsource(scaled), scaled.__defaults__, scaled.__kwdefaults__)
    with fd.derivative(of=scaled, vjp=lambda x, factor=2.0, *, shift=0.0: (scaled(x, factor, shift=shift), lambda g: (7 * g, None))):
        assert scaled(1.0, 3.0, shift=1.0) == 4.0
        assert fd.gradient(lambda x: scaled(x, shift=1.0), 1.0) == 7.0
        assert inspect.signature(scaled) == before[0] and inspect.getsource(scaled) == before[1]
        assert scaled.__code__.co_name == 'scaled' and scaled.__code__.co_filename == __file__
    assert (inspect.signature(scaled), inspect.getsource(scaled), scaled.__defaults__, scaled.__kwdefaults__) == before

def test_a_traceback_shows_the_users_def_line_and_no_markers():
    def failing(x): return x * 2
    def rule(x): raise ValueError('from the rule')
    with fd.derivative(of=failing, vjp=rule):
        with pytest.raises(ValueError) as info: fd.gradient(lambda x: failing(x), 1.0)   # the rule runs in a transform
    frames = traceback.extract_tb(info.tb)
    trampoline = [fr for fr in frames if fr.name == 'failing']
    assert trampoline and trampoline[0].lineno == failing.__code__.co_firstlineno
    assert trampoline[0].line.strip().startswith('def failing')
    text = ''.join(traceback.format_exception(info.type, info.value, info.tb))
    block = text.split('in failing\n', 1)[1].split('\n  File', 1)[0]
    assert '^' not in block and '~' not in block                # no column markers under the user's line

def test_labelled_like_keeps_every_instruction_on_the_def_line():
    def target(x): return x
    code = _labelled_like(_trampoline(0), target.__code__)
    lines = {line for *_, line in code.co_lines() if line is not None}
    assert lines == {target.__code__.co_firstlineno}
    if sys.version_info >= (3, 11):
        assert code.co_qualname == target.__code__.co_qualname
        assert all(p == (None, None) or p[0] is None for p in
                   ((c0, c1) for _, _, c0, c1 in code.co_positions()))   # no columns
