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
    assert x._recording is r and not hasattr(engine.Traced, "_trace")   # one name for the slot
    assert 'recording' in engine.Traced.__slots__[1] and '_trace' not in engine.Traced.__slots__
    assert fd.gradient(lambda x: x.trace(), np.eye(2)).tolist() == [[1., 0.], [0., 1.]]   # NumPy's trace


def test_patched_methods_leave_the_module_without_a_module_getattr():
    "fastcore's @patch binds a function's name in the module; a module-level __getattr__ would catch every missing name."
    assert getattr(engine, '__getattr__', None) is None or not callable(engine.__getattr__)
    assert not hasattr(engine, 'no_such_name')
    assert callable(engine.trace) and engine.trace is fd.trace


# ---------------------------------------------------------------- the lock release at interpreter exit

import subprocess, sys, textwrap

_RECORD = '''
import numpy as np, weakref
from fastad import engine
r = engine.Recording(); r.locks = {}
buf = np.ones(3); engine.lock(r, buf, 'multiply')
def pb(g): return g * buf                       # a pullback still held when the namespace goes
'''
# The callback as 03d's notebook defines it. Under nbdev_test the notebook runs in IPython, whose namespace is
# cleared at exit (IPython's reset): a pullback still held there is dropped after `engine` is gone, and the
# callback printed "NameError: name 'engine' is not defined".
_OLD_FORM = '''
_pending_releases = set()
def _release_when_dropped(pullback, trace):
    if not trace.locks: return
    def dropped(ref): _pending_releases.discard(ref); engine.release(trace)
    _pending_releases.add(weakref.ref(pullback, dropped))
_release_when_dropped(pb, r)
'''
_NEW_FORM = 'engine.release_when_dropped(pb, r)\n'
# The program: record in a namespace of its own, then clear it as IPython's reset does (dict.clear empties the
# namespace first, then drops its values), and exit with another pullback still held by a global.
_PROGRAM = '''
import sys
ns = {}
exec(sys.argv[1], ns)
ns.clear()
exec(sys.argv[1], globals())
'''


def _stderr_at_exit(code, *args, **env):
    import os
    run = subprocess.run([sys.executable, '-c', textwrap.dedent(code), *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env})
    assert run.returncode == 0, run.stderr
    return run.stderr


def test_the_release_callback_reads_no_globals_when_its_namespace_goes():
    assert _stderr_at_exit(_PROGRAM, _RECORD + _NEW_FORM) == ''


def test_the_old_callback_did_fail_when_its_namespace_went():
    "What the test above guards against: the same program with the callback that reads its namespace's globals."
    assert "NameError: name '" in _stderr_at_exit(_PROGRAM, _RECORD + _OLD_FORM)


def test_a_pullback_alive_at_exit_under_the_strict_backend_says_nothing():
    code = '''
    import numpy as np, fastad as fd
    buf = np.array([1., 2., 3.])
    value, pb = fd.value_with_pullback(lambda x: (x * buf).sum(), np.ones(3))
    '''
    assert _stderr_at_exit(code, FASTAD_BACKEND='strict') == ''


def test_release_when_dropped_releases_while_running():
    from fastad import engine
    r = engine.Recording(); r.locks = {}
    buf = np.ones(3); engine.lock(r, buf, 'multiply')
    def pb(g): return g * buf
    engine.release_when_dropped(pb, r)
    assert not buf.flags.writeable
    del pb
    assert buf.flags.writeable and r.locks is None
