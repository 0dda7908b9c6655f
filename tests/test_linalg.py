"""numpy.linalg (03a2, fastad.linalg) against float64 central differences, at first and second order.

Matrices are random and well conditioned (distinct eigen- and singular values, far from singular), in stacks
of the shapes hypothesis draws (derandomized, few examples), on NumPy and under the strict backend. Functions of
eigen- and singular vectors are tested through quantities that do not depend on the sign NumPy picks for each
vector (their squares, reconstructions), since only those are differentiable functions of the matrix.
"""
import numpy as np, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
import fastad as fd
from fastad.backend import to_device, to_host, np2
from fastad.errors import DifferentiationError, ShapeError, ArgumentError
from test_primitives_breadth import check_both


few = settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
batches = st.lists(st.integers(1, 2), max_size=2).map(tuple)

def square(seed, batch, n):
    "A well-conditioned n×n matrix (a stack of them): the identity, scaled, plus a small random part."
    return np.random.default_rng(seed).standard_normal(batch + (n, n)) * 0.4 + 2 * np.eye(n)

def spd(seed, batch, n):
    "A symmetric positive definite matrix with well-separated eigenvalues."
    x = np.random.default_rng(seed).standard_normal(batch + (n, n))
    return x @ np.swapaxes(x, -1, -2) + np.diag(np.arange(1.0, n + 1))

def general(seed, batch, m, n): return np.random.default_rng(seed).standard_normal(batch + (m, n))

def mT(x): return np.swapaxes(x, -1, -2)

SQUARE = {
    'inv': np.linalg.inv, 'det': np.linalg.det,
    'slogdet': lambda a: np.linalg.slogdet(a).logabsdet,
    'slogdet sign': lambda a: np.linalg.slogdet(-a)[0] * np.linalg.slogdet(-a)[1],
    'matrix_power 3': lambda a: np.linalg.matrix_power(a / 2, 3), 'matrix_power 0': lambda a: np.linalg.matrix_power(a, 0) * a,
    'matrix_power -2': lambda a: np.linalg.matrix_power(a, -2),
    'cond': np.linalg.cond, 'cond fro': lambda a: np.linalg.cond(a, 'fro'), 'cond -2': lambda a: np.linalg.cond(a, -2),
    'cond 1': lambda a: np.linalg.cond(a, 1),
}
SYMMETRIC = {
    'cholesky': np.linalg.cholesky, 'cholesky upper': lambda a: np.linalg.cholesky(a, upper=True),
    'eigh values': lambda a: np.linalg.eigh(a).eigenvalues, 'eigvalsh': np.linalg.eigvalsh,
    'eigvalsh U': lambda a: np.linalg.eigvalsh(a, 'U'),
    'eigh |v|²': lambda a: np.linalg.eigh(a).eigenvectors ** 2,
    'eigh U |v|²': lambda a: np.linalg.eigh(a, UPLO='U')[1] ** 2,
    'eigh rebuilt': lambda a: (lambda w, v: (v * w[..., None, :]) @ mT(v))(*np.linalg.eigh(a)),
    'eigh projector': lambda a: (lambda v: v[..., :, -1:] @ mT(v[..., :, -1:]))(np.linalg.eigh(a)[1]),
    'svd hermitian': lambda a: (lambda u, s, vh: u ** 2 + s[..., None, :] + vh ** 2)(*np.linalg.svd(a, hermitian=True)),
    'pinv hermitian': lambda a: np.linalg.pinv(a, hermitian=True),
}
RECTANGULAR = {
    'svd values': lambda a: np.linalg.svd(a, compute_uv=False), 'svdvals': np2.linalg.svdvals,
    'svd rebuilt': lambda a: (lambda u, s, vh: (u * s[..., None, :]) @ vh)(*np.linalg.svd(a, full_matrices=False)),
    'svd |u|² |v|²': lambda a: (lambda u, s, vh: u ** 2 @ vh ** 2)(*np.linalg.svd(a, full_matrices=False)),
    'svd full, first k': lambda a: (lambda u, s, vh, k: u[..., :, :k] ** 2 @ vh[..., :k, :] ** 2)(*np.linalg.svd(a), min(a.shape[-2:])),
    'pinv': np.linalg.pinv,
    'qr q': lambda a: np.linalg.qr(a).Q,
    'qr r': lambda a: np.linalg.qr(a).R, 'qr mode r': lambda a: np.linalg.qr(a, mode='r'),
    'norm 2': lambda a: np.linalg.norm(a, 2, axis=(-2, -1)), 'norm -2': lambda a: np.linalg.norm(a, -2, axis=(-1, -2)),
    'norm nuc': lambda a: np.linalg.norm(a, 'nuc', axis=(-2, -1), keepdims=True),
    'matrix_norm nuc': lambda a: np.linalg.matrix_norm(a, ord='nuc'),
}

@pytest.mark.parametrize('name', SQUARE)
@given(batch=batches, n=st.integers(1, 3), seed=st.integers(0, 2**31))
@few
def test_square(any_backend, name, batch, n, seed):
    check_both(SQUARE[name], square(seed, batch, n))

@pytest.mark.parametrize('name', SYMMETRIC)
@given(batch=batches, n=st.integers(1, 3), seed=st.integers(0, 2**31))
@few
def test_symmetric(any_backend, name, batch, n, seed):
    "Any matrix, not only symmetric ones: these functions read one triangle, and the gradient says so."
    a = spd(seed, batch, n)
    check_both(SYMMETRIC[name], a + np.triu(general(seed + 1, batch, n, n), 1) * 0.1)

@pytest.mark.parametrize('name', RECTANGULAR)
@given(batch=batches, m=st.integers(1, 4), n=st.integers(1, 4), seed=st.integers(0, 2**31))
@few
def test_rectangular(any_backend, name, batch, m, n, seed):
    a = general(seed, batch, m, n)
    if name.startswith('qr') or name.startswith('pinv'): a = a + 2 * np.eye(m, n)    # full rank, far from a sign flip
    check_both(RECTANGULAR[name], a)

@given(batch=batches, n=st.integers(1, 3), k=st.integers(1, 2), seed=st.integers(0, 2**31), vector=st.booleans())
@few
def test_solve_broadcasts(any_backend, batch, n, k, seed, vector):
    a, b = square(seed, batch, n), general(seed + 1, (), n, k)
    check_both(np.linalg.solve, a, b[:, 0] if vector else b)

@pytest.mark.parametrize('case', ['rank n-1', 'rank n-2', 'zero', 'stack'])
def test_det_of_singular_matrices(any_backend, case):
    "The cofactors: exact at singular matrices, at first and second order (det is a polynomial)."
    r = np.random.default_rng(3)
    x, y = r.standard_normal((4, 2)), r.standard_normal((2, 4))
    a = {'rank n-1': np.array([[1., 2., 3.], [4., 5., 6.], [7., 8., 9.]]), 'rank n-2': x @ y, 'zero': np.zeros((3, 3)),
         'stack': np.stack([np.array([[1., 2.], [2., 4.]]), 2 * np.eye(2)])}[case]
    check_both(np.linalg.det, a)

def test_eigh_slogdet_gradients_have_the_textbook_values():
    a = spd(0, (), 3)
    w, v = np.linalg.eigh(a)
    g = fd.gradient(lambda a: np.linalg.eigvalsh(a)[-1], a)                 # the top eigenvalue: v vᵀ, on the lower triangle
    np.testing.assert_allclose(g, np.tril(2 * np.outer(v[:, -1], v[:, -1])) - np.diag(v[:, -1] ** 2), atol=1e-12)
    np.testing.assert_allclose(fd.gradient(lambda a: np.linalg.slogdet(a)[1], a), np.linalg.inv(a).T, atol=1e-12)

def test_results_are_numpys_named_tuples(any_backend):
    a = to_device(spd(1, (2,), 3))
    def f(a):
        w, v = np.linalg.eigh(a)
        for r, fields in [(np.linalg.eigh(a), ('eigenvalues', 'eigenvectors')), (np.linalg.svd(a), ('U', 'S', 'Vh')),
                          (np.linalg.qr(a), ('Q', 'R')), (np.linalg.slogdet(a), ('sign', 'logabsdet'))]:
            assert r._fields == fields and all(fd.engine.is_traced(x) for x in r), type(r)
        return w.sum()
    fd.gradient(f, a)

def test_float32_in_float32_out():
    a = spd(2, (), 3).astype(np.float32)
    for f in (lambda a: np.linalg.eigh(a)[1][0, 0] ** 2, lambda a: np.linalg.svd(a)[1].sum(), lambda a: np.linalg.det(a),
              lambda a: np.linalg.inv(a).sum(), lambda a: np.linalg.cholesky(a).sum()):
        assert fd.gradient(f, a).dtype == np.float32

def test_eigenvalues_alone_are_differentiable_at_repeated_eigenvalues(any_backend):
    a = to_device(np.diag([1., 1., 2.]))
    np.testing.assert_allclose(to_host(fd.gradient(lambda a: np.linalg.eigvalsh(a) @ to_device(np.array([1., 1., 3.])), a)),
                               np.diag([1., 1., 3.]))            # a function symmetric in the repeated pair: exact
    np.testing.assert_allclose(to_host(fd.gradient(lambda a: np.linalg.eigh(a)[0].sum() + np.linalg.eigh(a)[1][:, 2].sum(), a)),
                               [[1, 0, 0], [0, 1, 0], [1, 1, 1]])   # the simple eigenvalue's vector: fine (it moves by
                                                                    # dA[i, 2] / (2 - 1) along e_i, read off the lower triangle)
    np.testing.assert_allclose(to_host(fd.gradient(lambda a: np.linalg.norm(a, 'nuc'), a)), np.eye(3))

UNDEFINED = [
    ('eigh: vectors of a repeated eigenvalue', lambda a: np.linalg.eigh(a)[1][0, 1], np.diag([1., 1., 2.]), "two eigenvalues are equal"),
    ('eigh: a projector over them', lambda a: (lambda v: v[:, :2] @ v[:, :2].T)(np.linalg.eigh(a)[1]).sum(), np.diag([1., 1., 2.]), "two eigenvalues are equal"),
    ('svd: equal singular values', lambda a: np.linalg.svd(a)[0][0, 1], np.diag([2., 2.]), "two singular values are equal"),
    ('svd: two zero singular values', lambda a: np.linalg.svd(a, full_matrices=False)[0].sum(), np.diag([3., 0., 0.]), "two singular values are"),
    ('svd: a zero singular value of a tall matrix', lambda a: np.linalg.svd(a, full_matrices=False)[0].sum(), np.ones((3, 2)), "a singular value is zero"),
    ('svd: the extra columns', lambda a: np.linalg.svd(a)[0].sum(), np.arange(6.).reshape(3, 2), "full_matrices=True, the extra columns"),
    ('slogdet: singular', lambda a: np.linalg.slogdet(a)[1], np.ones((2, 2)), "the matrix is singular"),
    ('qr: rank deficient', lambda a: np.linalg.qr(a)[1].sum(), np.ones((3, 2)), "does not have full rank"),
    ('qr: complete, tall', lambda a: np.linalg.qr(a, mode='complete')[1].sum(), np.eye(3, 2), "mode='complete' cannot be differentiated"),
    ('qr: raw', lambda a: np.linalg.qr(a, mode='raw')[1].sum(), np.eye(2), "mode='raw' cannot be differentiated"),
]

@pytest.mark.parametrize('name, f, a, message', UNDEFINED, ids=[u[0] for u in UNDEFINED])
def test_undefined_derivatives_are_clear_errors(any_backend, name, f, a, message):
    with pytest.raises(DifferentiationError, match=message): fd.gradient(f, to_device(a))

def test_refused_inputs():
    a = spd(0, (), 3)
    with pytest.raises(ArgumentError, match="UPLO must be 'L' or 'U'"): fd.gradient(lambda a: np.linalg.eigvalsh(a, 'x').sum(), a)
    with pytest.raises(ShapeError, match="numpy.linalg.slogdet: needs square matrices, not 3×2"):
        fd.gradient(lambda a: np.linalg.slogdet(a)[1], a[:, :2])
    with pytest.raises(DifferentiationError, match="as an index or a size"):
        fd.gradient(lambda a: np.linalg.matrix_power(a, a[0, 0]).sum(), a)
    with pytest.raises(DifferentiationError, match="result is complex"):
        fd.gradient(lambda a: np.linalg.inv(a.astype(complex)).real.sum(), a)
    with pytest.raises(np.linalg.LinAlgError): fd.gradient(lambda a: np.linalg.inv(a).sum(), np.ones((2, 2)))

def test_matrix_rank_is_a_plain_result():
    a = spd(0, (), 3)
    assert fd.gradient(lambda a: np.linalg.matrix_rank(a) * np.sum(a), a)[0, 0] == 3

def test_the_extra_columns_of_a_full_svd_may_go_unused(any_backend):
    "The first k columns of a full U carry the same derivative as the reduced U."
    a = general(4, (2,), 4, 2)
    full = lambda a: np.linalg.svd(a)[0][..., :, :2] ** 2
    reduced = lambda a: np.linalg.svd(a, full_matrices=False)[0] ** 2
    x = to_device(a)
    v = to_device(np.random.default_rng(0).standard_normal((2, 4, 2)))
    np.testing.assert_allclose(to_host(fd.pullback(full, x)(v)), to_host(fd.pullback(reduced, x)(v)), atol=1e-12)

@pytest.mark.parametrize('name', ['cholesky upper', 'svd hermitian'])
def test_the_ways_around_cupys_missing_keywords(monkeypatch, name):
    "CuPy's linalg takes no `upper` nor `hermitian`: fastad's way around them, run here on NumPy's arrays."
    import fastad.linalg as L
    monkeypatch.setattr(L, '_on_cupy', lambda a: True)
    a = spd(3, (2,), 3) + np.triu(general(4, (2,), 3, 3), 1) * 0.1       # its upper triangle differs from the lower
    np.testing.assert_allclose(fd.value_with_pullback(SYMMETRIC[name], a)[0], SYMMETRIC[name](a), rtol=1e-12, atol=1e-12)
    check_both(SYMMETRIC[name], a)

FORWARD_UNDEFINED = [      # (f, a, tangent): reverse mode refuses some cotangent there, so forward mode refuses too
    ('eigh: vectors of a repeated eigenvalue', lambda a: np.linalg.eigh(a)[1], np.diag([1., 1., 3.]),
     np.array([[0., 1., 0.], [1., 0., 0.], [0., 0., 0.]]), "two eigenvalues are equal"),
    ('svd: the extra columns of a full u', lambda a: np.linalg.svd(a)[0], np.arange(6.).reshape(3, 2), np.ones((3, 2)),
     "full_matrices=True, the extra columns"),
    ('svd: a zero singular value', lambda a: np.linalg.svd(a, full_matrices=False)[0], np.array([[1., 0.], [0., 0.], [0., 0.]]),
     np.array([[0., 1.], [1., 0.], [1., 0.]]), "a singular value is zero"),
]

@pytest.mark.parametrize('name, f, a, t, message', FORWARD_UNDEFINED, ids=[u[0] for u in FORWARD_UNDEFINED])
def test_forward_mode_refuses_where_reverse_mode_would(name, f, a, t, message):
    "Forward mode transposes the pullback: a rule that refuses on the cotangent's values must refuse there too."
    with pytest.raises(DifferentiationError, match=message): fd.differential(f, a)(t)      # was zeros, or [[0, -1], [1, 0], [1, 0]]
    with pytest.raises(DifferentiationError, match=message): fd.jacobian(f, a)               # by columns: 9 or 6 > 4 or 6 outputs
    with pytest.raises(DifferentiationError, match=message): fd.pullback(f, a)(np.ones_like(f(a)))

def test_forward_mode_still_differentiates_what_it_can_at_those_points():
    "The simple eigenvalue's vector, and the first k columns of a full u, keep their derivatives in forward mode."
    a, t = np.diag([1., 1., 3.]), np.array([[0., 1., 2.], [1., 0., 0.], [2., 0., 0.]])
    f = lambda a: np.linalg.eigh(a)[1][:, 2] ** 2 + np.linalg.eigh(a)[0]
    np.testing.assert_allclose(fd.differential(f, a)(t), fd.jacobian(f, a).reshape(3, 9) @ t.ravel(), atol=1e-12)
    m = general(1, (), 4, 2)
    full, reduced = (lambda a: np.linalg.svd(a)[0][:, :2] ** 2), (lambda a: np.linalg.svd(a, full_matrices=False)[0] ** 2)
    tm = general(2, (), 4, 2)
    np.testing.assert_allclose(fd.differential(full, m)(tm), fd.differential(reduced, m)(tm), atol=1e-12)
