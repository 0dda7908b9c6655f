"The registry: one registry, one rule form, names that don't collide; installing a derivative for a Python function."
import numpy as np, pytest
import fastad as fd

def test_trace_method_is_numpys_trace():
    "Traced's own slot is `_trace`: `x.trace()` is NumPy's trace, differentiated (it raised \"'Trace' object is not callable\")."
    np.testing.assert_array_equal(fd.gradient(lambda x: x.trace(), np.eye(2)), np.eye(2))
    x = np.arange(6.).reshape(2, 3)
    np.testing.assert_array_equal(fd.gradient(lambda x: x.trace(offset=1), x), [[0, 1, 0], [0, 0, 1]])
    assert fd.gradient(lambda x: (x * x).trace(), np.eye(3) * 2).tolist() == (np.eye(3) * 4).tolist()

from fastad import engine, dispatch, linalg
from fastad.primitives import REGISTRY, Row
import sys

def test_one_table():
    "The engine, the adapters and the linear-algebra rules share one table; no module keeps a second one."
    for module in (engine, dispatch, linalg): assert not hasattr(module, '_ADAPTERS') and not hasattr(module, 'ADAPTERS')
    assert not hasattr(engine, 'refresh_operators')
    assert all(type(row) is Row for row in REGISTRY.values())
    row = REGISTRY[np.sum]                                   # primitive and adapter in one row: the adapter uses it
    assert row.primitive.name == 'sum' and row.adapt is not None and row.rule is row.primitive and row.custom is None

def test_derivative_of_a_numpy_function_is_put_on_its_row():
    row, calls = REGISTRY[np.sum], []
    def sum_vjp(x, axis=None):
        calls.append(axis)
        return np.sum(x, axis=axis), lambda g: 2 * np.ones_like(x) * g
    with fd.derivative(of=np.sum, vjp=sum_vjp) as registration:
        assert row.custom is row.rule is registration.function
        assert fd.gradient(lambda x: np.sum(x), np.ones(3)).tolist() == [2., 2., 2.] and calls == [None]
    assert row.custom is None and row.rule is row.primitive and row.adapt is not None     # undo took it back
    assert fd.gradient(lambda x: np.sum(x, axis=0), np.ones(3)).tolist() == [1., 1., 1.]

def test_operators_read_the_row():
    "A derivative of np.add reaches `x + y` with no refresh step, and undo gives `+` its own rule back."
    def add_vjp(x, y): return x + y, lambda g: (3 * g, 0 * g)
    with fd.derivative(of=np.add, vjp=add_vjp):
        assert fd.gradient(lambda x, y: (x + y).sum(), np.ones(2), np.ones(2))[0].tolist() == [3., 3.]
    assert fd.gradient(lambda x, y: (x + y).sum(), np.ones(2), np.ones(2))[0].tolist() == [1., 1.]

def test_a_new_row_leaves_when_its_last_rule_is_undone():
    assert np.linalg.eigvals not in REGISTRY
    with fd.derivative(of=np.linalg.eigvals, vjp=lambda a: (np.linalg.eigvals(a), lambda g: g)):
        assert REGISTRY[np.linalg.eigvals].custom is not None
    assert np.linalg.eigvals not in REGISTRY

def test_supported_functions_reads_refusals_from_the_table():
    "A refusal is a flag on its row, not a function name: renaming the adapter changes nothing."
    row = REGISTRY[np.copyto]
    assert row.refused
    old = row.adapt.__name__
    try:
        row.adapt.__name__ = 'renamed'
        names = {n for ns in dispatch.supported_functions().values() for n in ns}
        assert 'numpy.copyto' not in names and 'numpy.put_along_axis' not in names and 'x.sort' not in names
    finally: row.adapt.__name__ = old


# ---- installing a derivative for a Python function: callable at every step, from any thread ------------------------
# Installing a derivative for a Python function: callable at every step, from any thread


def scaled(x, *, k=2.0): return x * k

def calls_failing_during(action):
    "Call `scaled(1.0)` at every bytecode of the redirection's install and restore, as another thread could."
    failures = []
    def at_each_opcode(frame, event, arg):
        if event == 'opcode':
            try: scaled(1.0)
            except TypeError as e: failures.append(str(e))
        return at_each_opcode
    def tracer(frame, event, arg):
        if frame.f_code.co_name not in ('install', 'restore'): return None
        frame.f_trace_opcodes = True
        return at_each_opcode
    sys.settrace(tracer)
    try: action()
    finally: sys.settrace(None)
    return failures

def test_a_function_with_keyword_only_defaults_stays_callable_while_its_derivative_is_installed():
    registrations = []
    register = lambda: registrations.append(fd.derivative(of=scaled, vjp=lambda x, *, k=2.0: (x * k, lambda g: g * k)))
    assert calls_failing_during(register) == []   # before: "missing 1 required keyword-only argument: '_fastad_rule'"
    assert fd.gradient(scaled, 1.0) == 2.0
    assert calls_failing_during(registrations[0].undo) == []
    assert scaled(1.0) == 2.0 and scaled.__kwdefaults__ == {'k': 2.0}

# SciPy's rules: values and slopes as SciPy and central differences give them


# ---- a rule carries its group: the listing by group is read from the rows -------------------------------------------
from fastad import primitives as P

def test_every_numpy_rule_names_its_group():
    "A rule registered for a NumPy callable says where `supported_functions()` lists it (a new one without: named here)."
    unnamed = sorted(getattr(f, '__name__', str(f)) for f, row in REGISTRY.items()
                     if row.primitive is not None and row.group is None)
    assert not unnamed, f"rules with no group=: {unnamed}"

def test_groups_are_derived_from_the_rows():
    "`supported_functions()` lists every NumPy row with a rule or an adapter under the group the row names, and nowhere else."
    table = fd.supported_functions()
    derived = P.groups()
    assert np.exp in derived['elementwise'] and np.linalg.cholesky in derived['linear algebra']
    listed = 0
    for f, row in REGISTRY.items():
        if row.primitive is None and row.adapt is None or row.refused and row.custom is None: continue
        name = dispatch._public_name(f)
        if not name.startswith('numpy'): continue
        group = row.group or 'other'
        assert name in table.get(group, ()), (name, group)
        assert [g for g, names in table.items() if name in names] == [group], name
        listed += 1
    assert listed > 150 and set(derived) <= set(table)

def test_a_new_rule_brings_its_group_and_domain():
    "One decorator: the rule, its row, its group and its domain."
    def halve(x): return x / 2
    @P.defvwc(halve, group='arithmetic', domain='elementwise real')
    def halve_vwc(x): return x / 2, lambda g: g / 2
    try:
        assert REGISTRY[halve].rule is halve_vwc.primitive and halve_vwc.primitive.domain == 'elementwise real'
        assert halve in P.groups()['arithmetic']
    finally: del REGISTRY[halve]
    assert halve not in P.groups()['arithmetic']
