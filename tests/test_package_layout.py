"""The package's layout: one word per idea, one helper per job, modules that say what they hold, and the layering
between them."""
import pathlib, re
import numpy as np
import pytest
import fastad as fd
from fastad import engine, drawing, errors

PACKAGE = pathlib.Path(fd.__file__).parent


def sources():
    "{module name: source} for the generated modules."
    return {p.stem: p.read_text() for p in PACKAGE.glob('*.py') if p.stem not in ('_modidx', '__init__')}


def defined_in(pattern):
    "The modules whose source matches `pattern` (a regex, multiline)."
    return sorted(m for m, s in sources().items() if re.search(pattern, s, re.M))


# ---------------------------------------------------------------- four names for four ideas

def test_the_recording_print_and_listing_have_names_of_their_own():
    "`fd.trace()` prints its caller; the engine's recording is a `Recording`; `tape_of` returns a `TapeListing`."
    from fastad import logs_and_collector
    assert callable(fd.trace) and fd.trace is logs_and_collector.trace
    assert not hasattr(engine, 'Trace') and not hasattr(fd, 'Tape')
    r = engine.Recording(); x = r.new_input(np.ones(2))
    assert x._recording is r and r.level >= 1 and r.tape == [None]
    listing = fd.tape_of(lambda x: np.sin(x).sum(), np.ones(3))
    assert type(listing) is drawing.TapeListing is fd.TapeListing
    assert [e.op for e in listing.primitives] == ['sin', 'sum']


def test_no_module_names_the_recording_trace():
    assert defined_in(r'\bTrace\b') == []
    assert defined_in(r'^class Tape\b') == ['toy']                # lesson 03's toy engine, where the word is the lesson's
    assert defined_in(r'^class Recording\b') == ['engine']
    assert defined_in(r'^class TapeListing\b') == ['drawing']


def test_lesson_03_names_its_toy_tape_and_the_real_recording_apart():
    import json
    nb = json.loads((PACKAGE.parent / 'nbs' / '03_vwc_chainers.ipynb').read_text())
    text = '\n'.join(''.join(c['source']) for c in nb['cells'])
    assert '| `Tape` | `fastad.engine.Recording`' in text and not re.search(r'engine\.Trace\b', text)


# ---------------------------------------------------------------- one helper each

def test_the_array_module_under_a_traced_value_is_one_helper():
    assert defined_in(r'^def array_module_under\b') == ['primitives']
    assert defined_in(r'^def (_xp|_module)\(x\)|^def _xp\(') == []
    assert defined_in(r'array_module\(unbox\(') == []
    from fastad import primitives, primitives_more, linalg, dispatch
    assert primitives_more.array_module_under is linalg.array_module_under is primitives.array_module_under
    assert dispatch.array_module_under is primitives.array_module_under and not hasattr(dispatch, '_module_under')
    r = engine.Recording(); x = r.new_input(r.new_input(np.ones(2)))
    assert primitives.array_module_under(x) is np


def test_a_functions_name_for_messages_is_one_helper():
    assert defined_in(r'^def name_of\b') == ['errors']
    # make_recomputed_in_gradient (checkpointing.py) keeps its own line until the recompute code is settled
    assert defined_in(r"getattr\(\w+, '__name__', type\(\w+\)\.__name__\)") in (['errors'], ['checkpointing', 'errors'])
    from fastad import transforms, forward, drawing as d, testing
    assert transforms.name_of is forward.name_of is d.name_of is testing.name_of is errors.name_of
    assert not hasattr(fd, 'name_of') and not hasattr(fd, 'whole_number')     # helpers of the modules, not fastad's names


def private_imports(modules=None):
    """`(module, from, name)` for each underscored name a module takes from another of fastad's modules: imported
    (`from .errors import _x`), or read off the module (`backend._x`, `P._x` after `from . import primitives as P`,
    `_transforms()._x` through an accessor)."""
    modules = sources() if modules is None else modules
    found = set()
    for module, src in modules.items():
        for m in re.finditer(r'^\s*from\s+(?:\.|fastad\.)(\w+)\s+import\s+(\([^)]*\)|[^\n]*)', src, re.M):
            names = re.sub(r'#[^\n]*', '', m.group(2)).strip('()').replace('\n', ' ').split(',')
            found |= {(module, m.group(1), n.split(' as ')[0].strip()) for n in names if n.strip().startswith('_')}
        aliases = {m: m for m in modules}                 # a module's own name, and the names it is imported as
        for m in re.finditer(r'^\s*from\s+(?:\.|fastad)\s+import\s+(\([^)]*\)|[^\n]*)', src, re.M):
            for n in re.sub(r'#[^\n]*', '', m.group(1)).strip('()').replace('\n', ' ').split(','):
                name, _, alias = n.strip().partition(' as ')
                if name in modules: aliases[alias.strip() or name] = name
        for alias, target in aliases.items():
            if target == module: continue
            for m in re.finditer(rf'(?<![\w.])_?{re.escape(alias)}(?:\(\))?\.(_[A-Za-z]\w*)', src):
                if not m.group(1).endswith('__'): found.add((module, target, m.group(1)))
    return sorted(found)


def test_modules_import_only_public_names_of_each_other():
    "A helper two modules share is public (documented and shown in its notebook), and the older private names are gone."
    assert private_imports() == []
    from fastad import backend, transforms, tree, primitives, primitives_more, layers
    for module, old in [(backend, '_rng'), (layers, '_positive'), (errors, '_is_whole'), (errors, '_whole_number'), (tree, '_fields_of'), (tree, '_is_traced'),
                        (transforms, '_as_gradient'),
                        (primitives, '_module_under'), (primitives, '_einsum_subscripts'), (primitives_more, '_along_axis_index')]:
        assert not hasattr(module, old), old                                         # no one reads them any more
    assert primitives.Entry is primitives.Row and repr(primitives.REGISTRY[np.sin]) == "Row(sin: primitive='sin')"


def test_a_new_private_import_is_caught():
    modules = {'a': "from .b import _x, y\nfrom . import c as C, d\nfrom fastad import e\n",
               'b': "", 'c': "", 'd': "", 'e': "", 'f': "",
               'g': "import x\ndef h(): return C._y, d._z, e._w, _f()._v, d.__name__, d.ok, self._u, x._t\nfrom . import c as C, d, e\n"}
    assert private_imports(modules) == [('a', 'b', '_x'), ('g', 'c', '_y'), ('g', 'd', '_z'), ('g', 'e', '_w'), ('g', 'f', '_v')]


def test_the_whole_number_check_is_one_helper():
    assert defined_in(r'Integral\) and not isinstance') == ['errors']
    assert defined_in(r'^def _size\(') == []
    assert defined_in(r'must be a whole number of') == ['errors']


@pytest.mark.parametrize('call, message', [
    (lambda: fd.Dense(0, 3), "Dense: input_size must be a whole number of 1 or more, got 0"),
    (lambda: fd.Dense(True, 3), "Dense: input_size must be a whole number of 1 or more, got True"),
    (lambda: fd.checkpoint_sequential([fd.Dense(2, 2)], segments=1.0), "checkpoint_sequential: segments must be a whole number of 1 or more, got 1.0"),
    (lambda: fd.checkpoint_sequential([fd.Dense(2, 2)], budget=0), "checkpoint_sequential: budget must be a whole number of 1 or more, got 0"),
    (lambda: fd.Conv2D((5, 5, 3, 6), strides=(1, True)), "Conv2D: strides must be two positive whole numbers (height, width)"),
    (lambda: fd.Conv2D((5, 5, 3, np.int64(0))), "Conv2D: filter_shape must be four positive whole numbers"),
    (lambda: fd.backend.zeros((2, -1)), "zeros: shape must be a size or a tuple of sizes (whole numbers, 0 or more)"),
])
def test_each_check_still_names_the_operation_and_argument(call, message):
    with pytest.raises(fd.ArgumentError, match=re.escape(message)): call()


def test_timed_takes_numpy_integers_and_refuses_the_rest():
    from fastad.timing import timed
    calls = []
    timed(lambda: calls.append(1), repeat=np.int64(2), warmup=np.int32(1), quiet=True)
    assert len(calls) == 3
    with pytest.raises(fd.ArgumentError, match=r"timed: warmup must be a whole number of 0 or more, got -1"):
        timed(print, warmup=-1)


# ---------------------------------------------------------------- modules that say what they hold

def test_layers_says_it_holds_layers_losses_and_optimizers():
    import fastad.layers as L
    first = L.__doc__.split('(')[0]
    assert first.startswith('Layers, a loss and optimizers') and 'derivative' not in first
    for name in ('Layer', 'Dense', 'Sequential', 'mse', 'SGD', 'Adam'): assert f'`{name}`' in L.__doc__


def test_the_progress_bar_is_a_module_of_its_own_and_data_still_has_it():
    import fastad.progress, fastad.data
    assert fastad.progress.progress.__module__ == 'fastad.progress'
    assert fastad.data.progress is fastad.progress.progress
    from fastad.data import progress                              # what users wrote stays valid
    assert list(progress(range(3), show=False)) == [0, 1, 2]
    assert defined_in(r'^def progress\(') == ['progress'] and defined_in(r'^def _watched\(') == ['progress']


def test_applied_for_backpropagation_is_a_transform():
    from fastad import transforms
    assert fd.applied_for_backpropagation is transforms.applied_for_backpropagation
    assert defined_in(r'^def applied_for_backpropagation\(') == ['transforms']
    import fastad.cnn as cnn
    assert 'applied_for_backpropagation' not in cnn.__all__
    model = fd.Dense(weight=np.array([[2.]]), bias=np.array([1.]))
    out, backprop = fd.applied_for_backpropagation(model, np.array([[3.]]))
    d_model, d_x = backprop(np.array([[1.]]))
    assert (out, d_model.weight, d_model.bias, d_x) == (np.array([[7.]]), np.array([[3.]]), np.array([1.]), np.array([[2.]]))


def test_the_layering_holds():
    "backend -> primitives -> locks, the log -> engine -> Traced's methods -> writes -> transforms -> layers: none imports one above it."
    order = ['errors', 'backend', 'primitives', 'locks', 'logs_and_collector', 'engine', 'traced_array', 'in_place',
             'transforms', 'layers']
    for i, low in enumerate(order):
        src = sources()[low]
        for high in order[i + 1:]:
            assert not re.search(rf'^\s*from \.{high} import|^\s*from \. import .*\b{high}\b', src, re.M), (low, high)


def test_the_engine_core_is_one_short_module_and_the_dispatch_is_one_hop_away():
    from fastad import dispatch, traced_array
    assert len(sources()['engine'].splitlines()) <= 400
    for protocol in ('__array_ufunc__', '__array_function__'):
        assert getattr(engine.Traced, protocol).__module__ == 'fastad.traced_array'
    assert 'fastad.traced_array' in dispatch.__doc__ and 'fastad.traced_array' in engine.Traced.__doc__
    assert np.ufunc not in fd.primitives.REGISTRY                    # a ufunc's keywords: beside __array_ufunc__
    assert dispatch.ufunc_keywords is traced_array.ufunc_keywords


def test_no_module_patches_a_class_another_module_defines():
    "A method lives where its class is defined: no `@patch` of a lower module's class (as layers did to `move`)."
    for module, src in sources().items():
        for cls in re.findall(r'^@patch\s*\ndef \w+\(self: (\w+)', src, re.M):
            assert re.search(rf'^class {cls}\b', src, re.M), (module, cls)
    from fastad import tree, layers, checkpointing
    assert fd.Differentiable.move.__module__ == 'fastad.tree'
    assert fd.Layer.discarding_activations.__module__ == 'fastad.layers'
    assert type(fd.Dense(2, 2).discarding_activations()) is checkpointing.ActivationDiscarding


def test_no_lower_module_keeps_a_table_an_upper_one_fills():
    "SciPy's functions reach fd.supported_functions() passed down by fastad.scipy_rules, not appended to a list of dispatch's."
    from fastad import dispatch, scipy_rules
    assert not hasattr(dispatch, 'MORE_TABLES') and 'MORE_TABLES' not in sources()['scipy_rules']
    assert fd.supported_functions is scipy_rules.supported_functions
    assert not any(g.startswith('scipy') for g in dispatch.supported_functions())
    assert dispatch.supported_functions(more={'scipy.x': ['scipy.x.f']})['scipy.x'] == ['scipy.x.f']


def test_each_idea_of_the_engine_has_one_name():
    assert defined_in(r'^def _in_place\(') == []
    assert defined_in(r'^def in_place_operator\(') == ['in_place'] and defined_in(r'^def _refused_in_place\(') == ['traced_array']
    for module in ('engine', 'traced_array', 'in_place', 'locks', 'logs_and_collector'):
        assert 'trace = Recording()' not in sources()[module]


def test_the_budget_planner_is_a_module_of_its_own():
    from fastad import planner, checkpointing
    assert set(planner.__all__) == {'LayerCost', 'measure_layers', 'estimate', 'plan_for_budget',
                                    'unrecorded', 'margin_bytes', 'best_plan', 'smallest_peak'}   # the last four: checkpointing's
    assert defined_in(r'^def _fronts\(|^def plan_for_budget\(|^def estimate\(|^def measure_layers\(') == ['planner']
    assert not set(planner.__all__) & set(checkpointing.__all__)
    for name in planner.__all__: assert getattr(checkpointing, name) is getattr(planner, name)   # old imports keep working
    assert 'checkpointing' not in re.findall(r'^from \.(\w+) import', sources()['planner'], re.M)
    toy = [planner.LayerCost(output=100, saved=0)] * 8
    assert planner.plan_for_budget(toy, 500, margin=0) == [(0, 4, True), (4, 8, False)]


def test_the_sidebar_lists_the_new_pages():
    sidebar = (PACKAGE.parent / 'nbs' / 'sidebar.yml').read_text()
    assert '07c_planner.ipynb' in sidebar and '90f_progress.ipynb' in sidebar


# ---------------------------------------------------------------- no module patches another at run time

def attribute_writes(modules=None):
    """`(module, other module, attribute)` for each write a module makes to an attribute of another of fastad's modules:
    `engine.f = g`, one of a tuple's targets (`a.f, b.g = ...`), `a.f += 1`, `setattr(a, 'f', g)`, `del a.f`, also through
    an accessor that imports and returns a module (`_transforms().f = g`). Such a write is a hidden back-edge: the lower
    module's notebook would not show what runs in its place."""
    import ast
    modules = sources() if modules is None else modules
    found = set()
    for module, src in modules.items():
        tree = ast.parse(src)
        aliases = {}                                   # names this module gives fastad's modules, wherever it imports them
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level == 1 and node.module is None or node.level == 0 and node.module == 'fastad'):
                aliases.update({a.asname or a.name: a.name for a in node.names if a.name in modules})
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name[7:] for a in node.names if a.asname and a.name[7:] in modules and a.name.startswith('fastad.')})
        accessors = {node.name: aliases[r.value.id] for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                     for r in ast.walk(node) if isinstance(r, ast.Return) and isinstance(r.value, ast.Name) and r.value.id in aliases}
        def target(v):
            "The module `v` names (`engine`, `_transforms()`), or None."
            if isinstance(v, ast.Name): return aliases.get(v.id)
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and not v.args: return accessors.get(v.func.id)
        def written(t):
            if isinstance(t, (ast.Tuple, ast.List)):
                for u in t.elts: yield from written(u)
            elif isinstance(t, ast.Starred): yield from written(t.value)
            elif isinstance(t, ast.Attribute): yield target(t.value), t.attr
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            pairs = [p for t in targets for p in written(t)]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ('setattr', 'delattr')
                    and node.args and isinstance(node.args[1] if len(node.args) > 1 else None, ast.Constant)):
                pairs.append((target(node.args[0]), node.args[1].value))
            found |= {(module, m, attr) for m, attr in pairs if m is not None and m != module}
    return sorted(found)


def test_no_module_writes_an_attribute_of_another_module():
    "A lower module offers a hook (fd.jit observes the engine through `fastad.locks.OBSERVER`); nobody swaps its functions."
    assert attribute_writes() == []


def test_a_new_attribute_write_is_caught():
    modules = {'a': "from . import b, c as C\nfrom fastad import d\nimport fastad.e as E\n"
                    "def f():\n    b.x = 1\n    C.y, (d.z, self.w) = 2, (3, 4)\n    E.v += 1\n    setattr(b, 'u', 0)\n    b.t.s = 1\n",
               'b': "", 'c': "", 'd': "", 'e': "",
               'f': "def _a():\n    from fastad import a\n    return a\ndef g(): _a().x = 1; del _a().y; f.x = 2; f().z = 3\n"}
    assert attribute_writes(modules) == [('a', 'b', 'u'), ('a', 'b', 'x'), ('a', 'c', 'y'), ('a', 'd', 'z'), ('a', 'e', 'v'),
                                         ('f', 'a', 'x'), ('f', 'a', 'y')]
