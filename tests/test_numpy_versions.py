"""fastad on every NumPy it supports (2.0 on) and every Python (3.10 on): the functions a NumPy lacks are simply not
registered, and where NumPy stops accepting an input fastad refuses it too. CI runs this suite on Python 3.10 with
NumPy 2.0 and on the newest Python with the newest NumPy."""
import numpy as np, pytest
import fastad as fd
from fastad.backend import np2, numpy_function, in_this_numpy, NUMPY_CROSSES_2_VECTORS, solve_takes_vectors
from fastad.dispatch import supported_functions
from fastad.primitives import REGISTRY
from fastad.errors import DifferentiationError, ShapeError
from test_primitives import check_pullback

NEW_IN_NUMPY_2 = ['matrix_transpose', 'cumulative_sum', 'cumulative_prod', 'unstack'] + [
    f'linalg.{n}' for n in ('outer', 'matmul', 'tensordot', 'vecdot', 'cross', 'diagonal', 'trace',
                            'matrix_transpose', 'vector_norm', 'matrix_norm', 'svdvals')]

def np2_entry(path):
    o = np2
    for part in path.split('.'): o = getattr(o, part)
    return o

def test_import_registers_what_this_numpy_has():
    assert None not in REGISTRY
    names = {n for ns in supported_functions().values() for n in ns}
    for path in NEW_IN_NUMPY_2:
        f = numpy_function(path)
        assert np2_entry(path) is f
        assert (f is not None) == hasattr(np.linalg if path.startswith('linalg.') else np, path.split('.')[-1]), path
        if f is not None: assert REGISTRY[f].adapt is not None, path
    assert ('numpy.cumulative_sum' in names) == hasattr(np, 'cumulative_sum')
    assert 'numpy.cumsum' in names and 'numpy.linalg.norm' in names

def test_numpy_2_names_work_where_numpy_has_them():
    x = np.arange(1.0, 7.0).reshape(2, 3)
    if np2.cumulative_sum is None: pytest.skip(f"NumPy {np.__version__} has no np.cumulative_sum")
    g = fd.gradient(lambda x: np.sum(np.cumulative_sum(x, axis=1) ** 2), x)
    np.testing.assert_allclose(g, fd.gradient(lambda x: np.sum(np.cumsum(x, axis=1) ** 2), x))

def test_in_this_numpy_drops_the_missing():
    assert in_this_numpy({np.sum: 1, None: 2}) == {np.sum: 1}
    assert numpy_function('linalg.no_such_function') is None and numpy_function('linalg.norm') is np.linalg.norm

def test_cross_of_2_vectors_follows_this_numpy():
    "NumPy 2.0 deprecated np.cross of 2-vectors and 2.5 refuses it; fastad computes it exactly where NumPy does."
    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    if NUMPY_CROSSES_2_VECTORS:
        with pytest.warns(DeprecationWarning):
            expected = np.cross(a, b)
        value, g = fd.value_with_gradient(lambda a: np.cross(a, b), a)
        assert value == expected and list(g) == [4.0, -3.0]
    else:
        with pytest.raises(ValueError): np.cross(a, b)
        with pytest.raises(ShapeError, match=r"numpy\.cross: vectors must have 3 components, not 2 and 2"):
            fd.gradient(lambda a: np.cross(a, b), a)
    value, g = fd.value_with_gradient(lambda a: np.sum(np.cross(a, [0.0, 0.0, 1.0])), np.array([1.0, 2.0, 3.0]))
    assert value == 1.0 and list(g) == [-1.0, 1.0, 0.0]                  # 3-vectors on every NumPy

@pytest.mark.parametrize('store', ['a[0] = x', 'a[:2] = x', 'a[i] = x', 'a[0:n] = x'])
def test_storing_a_traced_value_says_in_place_on_every_python(store):
    "Python 3.12 compiles `a[i:j] = x` to STORE_SLICE, not STORE_SUBSCR: both say `in-place`."
    code = f"def f(x):\n    a = np.zeros(3); i, n = 0, 2\n    {store}\n    return a.sum()"
    scope = {'np': np}; exec(code, scope)
    with pytest.raises((DifferentiationError, ValueError)) as e: fd.gradient(scope['f'], np.ones(2) if ':' in store else 1.0)
    err = e.value if isinstance(e.value, DifferentiationError) else e.value.__cause__
    assert isinstance(err, DifferentiationError) and 'in-place' in str(err), repr(e.value)

def test_solve_reads_b_as_numpy_2_does():
    "From NumPy 2.0 on, np.linalg.solve reads b as vectors only when it is 1-d (NumPy 1.26 did whenever b had one axis less)."
    r = np.random.default_rng(0)
    a, b = r.standard_normal((3, 2, 2)) + 3 * np.eye(2), r.standard_normal((3, 2))
    assert not solve_takes_vectors(a, b) and solve_takes_vectors(a[0], b[0])
    with pytest.raises(ValueError): np.linalg.solve(a, b)                  # b is a 3x2 matrix: it does not fit
    check_pullback(np.linalg.solve, a, b[..., None])                       # three 2x1 matrices
    check_pullback(np.linalg.solve, a[0], b[0])                            # one 2-vector

def test_pyproject_promises_the_numpy_ci_tests():
    "The oldest NumPy that CI runs (.ci/run) is the floor that pyproject.toml promises."
    from pathlib import Path
    root = Path(__file__).parent.parent
    assert '"numpy>=2.0",' in (root / 'pyproject.toml').read_text()
    assert "'numpy==2.0.*'" in (root / '.ci' / 'run').read_text()
