"""Soundness of the transforms: custom rules at every trace level, closures refused, models rebuilt through their
constructor, the custom pullbacks' memo per thread, registrations that can be undone, and one structure walker."""
import dataclasses, inspect, sys, threading, traceback
from collections import OrderedDict, defaultdict, namedtuple
import numpy as np, pytest
import fastad as fd
from fastad.errors import DifferentiationError
from fastad.tree import map_structure, flatten, is_container

def close(a, b, **kw): np.testing.assert_allclose(a, b, **({'rtol': 1e-9, 'atol': 1e-12} | kw))

# --- 1b: a custom rule is what gets differentiated, at every trace level ----------------------------------
def safe_log_vjp(x): return np.log(x), lambda g: g / np.maximum(x, 1e-3)
safe_log = fd.differentiable_function(safe_log_vjp, name='safe_log')

def test_custom_rule_is_used_at_the_outer_level_of_mixed_arguments():
    # the value of the inner transform, differentiated by the outer one: the rule says 1 / max(a, 1e-3)
    got = fd.gradient(lambda a: fd.value_with_gradient(lambda z: safe_log(a + z), 0.0)[0], 1e-6)
    close(got, 1e3)

def test_registered_rule_is_used_at_the_outer_level_of_mixed_arguments():
    def guarded_log(x): return np.log(x)
    with fd.derivative(of=guarded_log, vjp=lambda x: (guarded_log(x), lambda g: g / np.maximum(x, 1e-3))):
        close(fd.gradient(lambda a: fd.value_with_gradient(lambda z: guarded_log(a + z), 0.0)[0], 1e-6), 1e3)

def test_custom_rule_at_second_order_with_mixed_levels():
    # inner gradient: 2 safe_log(x) rule(x); its derivative in a: 2 rule(x)^2 + 2 safe_log(x) rule'(x), rule' = 0 below 1e-3
    got = fd.gradient(lambda a: fd.gradient(lambda z: safe_log(a + z) * safe_log(a + z), 0.0), 1e-6)
    close(got, 2e6)
    close(fd.gradient(lambda a: fd.gradient(lambda z: safe_log(a + z), 0.0), 2.0), -0.25)   # the rule's own derivative
    close(fd.gradient(fd.gradient(safe_log))(2.0), -0.25)
    close(fd.gradient(fd.gradient(fd.gradient(safe_log)))(2.0), 2 / 8)

def test_custom_rule_with_two_arguments_on_different_levels():
    calls = []
    def scaled_vjp(x, y):
        calls.append(1)
        return x * y, lambda g: (g * y * 10, g * x * 10)                 # deliberately 10x: it must be used
    scaled = fd.differentiable_function(scaled_vjp, name='scaled')
    got = fd.gradient(lambda a: fd.value_with_gradient(lambda z: scaled(a, z), 3.0)[0], 2.0)
    close(got, 30.0)                                                     # d/da of the rule's value a * z: 10 z

def test_custom_rule_with_structured_arguments_on_mixed_levels():
    class Lin(fd.Differentiable):
        w: np.ndarray
    def lin_vjp(m, x): return (m.w * x).sum(), lambda g: (Lin(g * x * 10), g * m.w)   # w's cotangent 10x: must be used
    lin = fd.differentiable_function(lin_vjp, name='lin')
    x = np.array([1.0, 2.0])
    got = fd.gradient(lambda m: fd.value_with_gradient(lambda z: lin(m, z), x)[0], Lin(np.ones(2)))
    close(got.w, 10 * x)
    pair = fd.differentiable_function(lambda a: ((a * 2, a * 3), lambda g: g[0] * 20 + g[1] * 30), name='pair')
    close(fd.gradient(lambda a: fd.value_with_gradient(lambda z: pair(a + z)[1], 0.0)[0], 1.0), 30.0)

# --- 1c: a VJP whose value comes from a traced value it was not given is refused ------------------------------
def test_closure_over_a_traced_value_with_plain_arguments_is_refused():
    def loss(x): return fd.differentiable_function(lambda y: (x * y, lambda g: 0 * g), name='closes')(2.0)
    with pytest.raises(DifferentiationError, match="closes: its VJP computed its value from a traced value it was not given"):
        fd.gradient(loss, 3.0)

def test_closure_over_an_outer_traced_value_is_refused():
    def loss(x):
        f = fd.differentiable_function(lambda y: (x * y, lambda g: g * x), name='closes')
        return fd.gradient(lambda y: f(y), 2.0)
    with pytest.raises(DifferentiationError, match="closes: its VJP computed its value from a traced value"):
        fd.gradient(loss, 3.0)

def test_closure_over_a_traced_value_through_a_registered_forward_is_refused():
    def loss(x):
        def scaled(y): return x * y
        with fd.derivative(of=scaled, vjp=lambda y: (scaled(y), lambda g: 0 * g)): return scaled(2.0)
    with pytest.raises(DifferentiationError, match="scaled: its VJP computed its value from a traced value"):
        fd.gradient(loss, 3.0)

# --- 1d: models are rebuilt through their constructor; frozen models work -----------------------------------
class Cached(fd.Differentiable):
    w: np.ndarray
    cache: np.ndarray = dataclasses.field(init=False)
    def __post_init__(self): self.cache = self.w * 2

def test_a_field_derived_in_post_init_is_recomputed_from_traced_values():
    m = Cached(np.array([1.0, 2.0]))
    g = fd.gradient(lambda m: (m.cache * m.w).sum(), m)                 # sum(2 w^2): 4 w
    assert type(g) is Cached
    close(g.w, [4.0, 8.0])
    assert g.cache is None               # a gradient runs no model code, and the model's derived field is no gradient

@dataclasses.dataclass(frozen=True)
class Frozen(fd.Differentiable):
    w: np.ndarray
    b: float = 0.5
    tag: str = fd.nondifferentiable(default='frozen')

def test_frozen_models_can_be_built_differentiated_and_rebuilt():
    m = Frozen(np.array([1.0, 2.0]))
    with pytest.raises(dataclasses.FrozenInstanceError): m.w = None
    g = fd.gradient(lambda m: (m.w * m.b).sum(), m)
    assert type(g) is Frozen and g.tag == 'frozen'
    close(g.w, [0.5, 0.5]); close(g.b, 3.0)
    stopped = fd.without_derivative(m)
    assert type(stopped) is Frozen and stopped.tag == 'frozen'
    assert [f.name for f in dataclasses.fields(Frozen) if f.metadata.get('differentiable', True)] == ['w', 'b']

def test_an_explicit_dataclass_decorator_keeps_nondifferentiable_fields():
    @dataclasses.dataclass
    class Plain(fd.Differentiable):
        w: float
        scale: float = fd.nondifferentiable(default=3.0)
        seen: list = dataclasses.field(default_factory=list)
    g = fd.gradient(lambda m: m.w * m.scale, Plain(2.0))
    assert g.w == 3.0 and g.scale == 3.0 and g.seen == []

def test_subclasses_of_models_inherit_fields():
    class Base(fd.Differentiable):
        w: float
    class Child(Base):
        v: float = 1.0
    g = fd.gradient(lambda m: m.w * m.v * 3, Child(2.0, 5.0))
    assert type(g) is Child and (g.w, g.v) == (15.0, 6.0)
    assert Base(1.0).w == 1.0 and [f.name for f in dataclasses.fields(Child)] == ['w', 'v']

# --- models rebuilt by setting their fields, only where the constructor does nothing more --------------------
from fastad.tree import stores_its_fields

class Counted(fd.Differentiable):
    "A model with an __init__ of its own that counts its calls."
    w: np.ndarray
    calls = []
    def __init__(self, w):
        Counted.calls.append(1)
        object.__setattr__(self, 'w', w)

@stores_its_fields
class CountedStoring(Counted):
    v: float = 1.0
    def __init__(self, w, v=1.0):
        CountedStoring.calls.append(1)
        object.__setattr__(self, 'w', w); object.__setattr__(self, 'v', v)

def test_a_model_whose_constructor_only_stores_its_fields_is_rebuilt_without_calling_it():
    m = CountedStoring(np.array([1.0, 2.0]), 3.0)
    CountedStoring.calls.clear()
    g = fd.gradient(lambda m: (m.w * m.v).sum(), m)
    assert type(g) is CountedStoring and CountedStoring.calls == []     # neither the traced copy nor the gradient called it
    close(g.w, [3.0, 3.0]); close(g.v, 3.0)

def test_a_model_with_its_own_constructor_is_still_rebuilt_through_it():
    m = Counted(np.array([1.0, 2.0]))
    Counted.calls.clear()
    g = fd.gradient(lambda m: (m.w ** 2).sum(), m)
    assert type(g) is Counted and len(Counted.calls) == 1                # the traced copy (a gradient runs no model code)
    close(g.w, [2.0, 4.0])

def test_a_subclass_of_a_storing_model_with_a_post_init_gets_it_run():
    class Derived(CountedStoring):
        twice: np.ndarray = dataclasses.field(init=False, default=None)
        def __post_init__(self): object.__setattr__(self, 'twice', self.w * 2)
    m = Derived(np.array([1.0, 2.0]))
    g = fd.gradient(lambda m: (m.twice * m.w).sum(), m)                # sum(2 w^2): 4 w
    close(g.w, [4.0, 8.0]); assert g.twice is None                    # a gradient runs no model code, nor carries the model's

def test_a_model_with_its_own_setattr_sees_every_rebuild():
    seen = []
    class Watched(fd.Differentiable):
        w: float
        def __setattr__(self, name, value):
            seen.append(name)
            object.__setattr__(self, name, value)
    g = fd.gradient(lambda m: m.w * 3.0, Watched(2.0))
    assert g.w == 3.0 and seen == ['w', 'w']                           # built, traced copy (a gradient runs no model code)

def test_labels_in_errors_name_the_path_to_the_item():
    with pytest.raises(DifferentiationError, match=r"argument 1\[1\] is a str"): flatten((1.0, [2.0, 'x']), arguments=True)
    with pytest.raises(DifferentiationError, match=r"argument\['k'\]\[0\]\[1\] is a NoneType"): flatten({'k': [(1.0, None)]})

# --- 4: the custom pullbacks' memo belongs to each thread ---------------------------------------------------
def test_custom_pullbacks_of_one_function_in_four_threads():
    def mul_vjp(a, b): return a * b, lambda g: (g * b, g * a)
    mul = fd.differentiable_function(mul_vjp, name='mul')
    pb = fd.pullback(lambda a, b: mul(a, b) + mul(b, a), np.ones(3), np.full(3, 2.0))
    errors, old = [], sys.getswitchinterval()
    def work(k):
        try:
            for _ in range(3000):
                ga, gb = pb(np.full(3, float(k)))
                if not (np.all(ga == 4.0 * k) and np.all(gb == 2.0 * k)): errors.append((k, ga, gb))
        except Exception as e: errors.append(e)
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
        for t in threads: t.start()
        for t in threads: t.join()
    finally: sys.setswitchinterval(old)
    assert errors == []

# --- 6: one walker -----------------------------------------------------------------------------------------
Pair = namedtuple('Pair', 'a b')

@dataclasses.dataclass
class Box:
    content: object
    label: str = 'box'

class Model(fd.Differentiable):
    w: np.ndarray
    name: str = fd.nondifferentiable(default='m')

def test_map_structure_walks_every_container_and_keeps_its_type():
    d = defaultdict(list, {'k': 1.0})
    x = {'t': (1.0, [2.0, Pair(3.0, 4.0)]), 'o': OrderedDict(z=5.0), 'd': d, 'box': Box(6.0),
         'm': Model(np.ones(2)), 'f': Frozen(np.ones(1))}
    y = map_structure(lambda v: v * 10 if isinstance(v, (float, np.ndarray)) else v, x)
    assert type(y['t']) is tuple and type(y['t'][1]) is list and type(y['t'][1][1]) is Pair
    assert y['t'][1][1] == Pair(30.0, 40.0) and y['t'][0] == 10.0
    assert type(y['o']) is OrderedDict and y['o']['z'] == 50.0
    assert type(y['d']) is defaultdict and y['d']['k'] == 10.0 and y['d']['missing'] == []   # keeps its factory
    assert type(y['box']) is Box and y['box'].content == 60.0 and y['box'].label == 'box'
    assert type(y['m']) is Model and y['m'].name == 'm'
    close(y['m'].w, [10.0, 10.0]); close(y['f'].w, [10.0]); assert y['f'].b == 5.0
    assert x['t'][0] == 1.0 and x['box'].content == 6.0                      # the input is untouched
    assert all(is_container(v) for v in x.values()) and not is_container(np.ones(2)) and not is_container(Box)

def test_flatten_and_without_derivative_agree_with_the_walker():
    x = (Box(np.ones(2)), {'m': Model(np.ones(2))}, [Pair(1.0, 2.0)])
    leaves, rebuild = flatten(x)
    assert len(leaves) == 4
    back = rebuild([l * 2 for l in leaves])
    assert type(back[0]) is Box and type(back[1]['m']) is Model and type(back[2][0]) is Pair
    g = fd.gradient(lambda t: fd.without_derivative(t)[0].content.sum() + t[2][0].a * 3, x)
    close(g[0].content, [0.0, 0.0]); assert g[2][0].a == 3.0

def test_tree_imports_nothing_above_errors():
    import ast, fastad.tree
    module = ast.parse(inspect.getsource(fastad.tree))
    from_fastad = [n.module for n in module.body if isinstance(n, ast.ImportFrom) and (n.level or n.module.startswith('fastad'))]
    assert from_fastad == ['errors'], from_fastad                      # the backend can import the walker

# --- 5: registrations a user can see and undo ---------------------------------------------------------------
def lopsided(x):
    "Doubles x."
    return 2 * x

def test_a_registration_can_be_undone_and_stacks():
    assert fd.registered_derivative(lopsided) is None
    @fd.derivative(of=lopsided)
    def lopsided_vjp(x): return lopsided(x), lambda g: g * 100
    assert lopsided_vjp.__name__ == 'lopsided_vjp'                     # the decorator returns the VJP
    first = fd.registered_derivative(lopsided)
    assert first.vjp is lopsided_vjp and first.of is lopsided and 'lopsided' in repr(first)
    assert fd.gradient(lopsided, 1.0) == 100.0
    second = fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 7))   # again: the last one wins
    assert fd.gradient(lopsided, 1.0) == 7.0 and fd.registered_derivative(lopsided) is second
    second.undo()
    assert fd.gradient(lopsided, 1.0) == 100.0                           # undoing the later restores the earlier
    second.undo()                                                        # a second undo does nothing
    first.undo()
    assert fd.gradient(lopsided, 1.0) == 2.0 and fd.registered_derivative(lopsided) is None
    assert lopsided(3.0) == 6.0

def test_undo_of_an_earlier_registration_keeps_the_later_in_force():
    first = fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 100))
    second = fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 7))
    first.undo()
    assert fd.gradient(lopsided, 1.0) == 7.0
    second.undo()
    assert fd.gradient(lopsided, 1.0) == 2.0

def test_the_context_manager_form():
    with fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g * 100)) as reg:
        assert fd.gradient(lopsided, 1.0) == 100.0 and reg.active
    assert fd.gradient(lopsided, 1.0) == 2.0 and not reg.active

def test_a_registered_function_keeps_its_source_help_and_tracebacks():
    source, signature, doc = inspect.getsource(lopsided), inspect.signature(lopsided), lopsided.__doc__
    with fd.derivative(of=lopsided, vjp=lambda x: (lopsided(x), lambda g: g)):
        assert inspect.getsource(lopsided) == source and inspect.signature(lopsided) == signature
        assert lopsided.__doc__ == doc and lopsided.__name__ == 'lopsided'
        assert 'Doubles x.' in fd.__class__.__name__ + __import__('pydoc').render_doc(lopsided)
        with pytest.raises(TypeError) as info: lopsided('a', 'b')
        files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
        assert '<string>' not in files and all(f.endswith('.py') for f in files)
        names = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert 'trampoline' not in names and 'lopsided' in names
    assert inspect.getsource(lopsided) == source

def test_tracebacks_through_a_registered_function_show_the_users_file():
    def fails(x): raise ValueError("from the user's code")
    with fd.derivative(of=fails, vjp=lambda x: (fails(x), lambda g: g)):
        with pytest.raises(ValueError) as info: fails(1.0)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename == __file__ and frames[-1].name == 'fails'
    assert all(f.filename != '<string>' for f in frames)

def test_numpy_registrations_are_undone():
    close(fd.gradient(lambda x: np.cbrt(x).sum(), np.ones(2)), [1 / 3, 1 / 3])                 # fastad's own rule
    with fd.derivative(of=np.cbrt, vjp=lambda x: (np.cbrt(x), lambda g: g * 5)):
        close(fd.gradient(lambda x: np.cbrt(x).sum(), np.ones(2)), [5.0, 5.0])
        with fd.derivative(of=np.add, vjp=lambda a, b: (np.add(a, b), lambda g: (g * 3, g * 5))):
            assert fd.gradient(lambda x, y: x + y, 1.0, 2.0) == (3.0, 5.0)             # the operator follows
        with fd.derivative(of=np.sum, vjp=lambda x, axis=None, keepdims=False: (np.sum(x), lambda g: g * 7 * np.ones_like(x))):
            close(fd.gradient(lambda x: x.sum(), np.ones(2)), [7.0, 7.0])
    assert fd.gradient(lambda x, y: x + y, 1.0, 2.0) == (1.0, 1.0)
    close(fd.gradient(lambda x: x.sum(axis=0), np.ones(2)), [1.0, 1.0])                   # the engine's own sum again
    close(fd.gradient(lambda x: np.cbrt(x).sum(), np.ones(2)), [1 / 3, 1 / 3])                 # and its own cbrt

def test_registration_errors_are_clear():
    with pytest.raises(DifferentiationError, match="derivative: `of` must be a function, not a float"): fd.derivative(of=3.0)
    with pytest.raises(DifferentiationError, match="derivative: vjp must be a function"): fd.derivative(of=lopsided, vjp=3)
    import math
    with pytest.raises(DifferentiationError, match="derivative: cannot reach every call of exp"):
        fd.derivative(of=math.exp, vjp=lambda x: (math.exp(x), lambda g: g * math.exp(x)))
    def one(x): return x * 3.0
    with fd.derivative(of=one, vjp=lambda x, y: (x * y, lambda g: (g, g))):
        with pytest.raises(DifferentiationError, match=r"one: these arguments do not fit its VJP \(x, y\): missing a required argument: 'y'"):
            fd.gradient(one, 1.0)
    with fd.derivative(of=one, vjp=lambda x: (x * 3.0, lambda: 1.0)):
        with pytest.raises(DifferentiationError, match="one: its pullback must take one argument, the cotangent"):
            fd.gradient(one, 1.0)
    assert one(2.0) == 6.0

class Sized(fd.Differentiable):
    w: np.ndarray
    def __init__(self, n): object.__setattr__(self, 'w', np.ones(n))      # an __init__ that does not take the field

def test_a_model_whose_init_does_not_take_its_fields_is_copied_field_by_field():
    g = fd.gradient(lambda m: (m.w * 3).sum(), Sized(2))
    assert type(g) is Sized
    close(g.w, [3.0, 3.0])

def test_map_structure_with_unbox_strips_every_level():
    from fastad.engine import unbox
    def inner(m): 
        plain = map_structure(unbox, {'m': m, 't': (m.w, 2)})
        assert type(plain['m']) is Model and type(plain['m'].w) is np.ndarray and plain['t'][1] == 2
        return (m.w ** 2).sum()
    close(fd.gradient(lambda m: fd.gradient(inner, m).w.sum(), Model(np.ones(2))).w, [2.0, 2.0])

# --- value_with_gradient frees its tape as the sweep runs ----------------------------------------------------
def test_value_with_gradient_consumes_its_tape_but_pullbacks_stay_reusable():
    import fastad.transforms as T
    traces = []
    real = T.Recording
    class Spy(real):
        def __init__(self):
            super().__init__()
            traces.append(self)
    T.Recording = Spy
    try:
        assert fd.value_with_gradient(lambda x: np.sin(x) * x, 1.0)[1] == pytest.approx(np.cos(1.0) + np.sin(1.0))
        pb = fd.pullback(lambda x: np.sin(x) * x, 1.0)
        assert pb(1.0) == pb(1.0)                                          # a pullback you hold runs many times
    finally: T.Recording = real
    assert all(entry is None for entry in traces[0].tape)                 # every entry dropped once it had run
    assert any(entry is not None for entry in traces[1].tape)
