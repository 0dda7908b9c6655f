"""The engine notebook in small steps (issue 18 point 8), its words for the recording, and the lock release at exit."""
import json, pathlib
import numpy as np
import fastad as fd
from fastad import engine

NBS = pathlib.Path(engine.__file__).parent.parent / 'nbs'


def test_engine_notebook_has_no_code_cell_over_60_lines():
    cells = json.loads((NBS / '03b_engine.ipynb').read_text())['cells']
    long = [(c['id'], len(''.join(c['source']).splitlines())) for c in cells
            if c['cell_type'] == 'code' and len(''.join(c['source']).splitlines()) > 60]
    assert long == [], long


def test_a_traced_value_names_its_recording():
    r = engine.Recording()
    x = r.new_input(np.ones(2))
    assert x._recording is r and x._trace is r          # the old name still reads, for the transforms
    assert 'recording' in engine.Traced.__slots__[1] and '_trace' not in engine.Traced.__slots__
    assert fd.gradient(lambda x: x.trace(), np.eye(2)).tolist() == [[1., 0.], [0., 1.]]   # NumPy's trace


def test_patched_methods_leave_the_module_without_a_module_getattr():
    "fastcore's @patch binds a function's name in the module; a module-level __getattr__ would catch every missing name."
    assert getattr(engine, '__getattr__', None) is None or not callable(engine.__getattr__)
    assert not hasattr(engine, 'no_such_name')
    assert callable(engine.trace) and engine.trace is fd.trace
