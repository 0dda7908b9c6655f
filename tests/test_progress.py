"""One progress bar style (tqdm's text bar), shown only where someone watches: never in saved outputs or test logs."""
import hashlib, sys, types
import pytest
from fastad.data import progress, download

@pytest.fixture
def place(monkeypatch):
    "Put the process somewhere: a terminal, a JupyterLab kernel, nbconvert --execute, nbdev_test; returns a setter."
    for var in ('FASTAD_PROGRESS', 'IN_TEST', 'JPY_SESSION_NAME'): monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, 'ipykernel', raising=False)
    def put(tty=False, kernel=False, session=False, nbdev_test=False, forced=None):
        monkeypatch.setattr(sys.stderr, 'isatty', lambda: tty, raising=False)
        if kernel: monkeypatch.setitem(sys.modules, 'ipykernel', types.ModuleType('ipykernel'))
        if session: monkeypatch.setenv('JPY_SESSION_NAME', 'nbs/01_matmul.ipynb')
        if nbdev_test: monkeypatch.setenv('IN_TEST', '1')
        if forced is not None: monkeypatch.setenv('FASTAD_PROGRESS', forced)
    return put

@pytest.mark.parametrize('where, shown', [
    (dict(tty=True), True),                                      # a terminal
    (dict(tty=False), False),                                    # output sent to a file or a CI log
    (dict(kernel=True, session=True), True),                     # a notebook open in JupyterLab
    (dict(kernel=True), False),                                  # jupyter nbconvert --execute: outputs being saved
    (dict(tty=True, nbdev_test=True), False),                    # nbdev_test
    (dict(kernel=True, session=True, nbdev_test=True), False),
    (dict(tty=False, forced='1'), True),                         # forced on
    (dict(tty=True, forced='0'), False),                         # forced off
    (dict(kernel=True, session=True, forced='off'), False),
])
def test_shown_only_where_someone_watches(place, where, shown):
    place(**where)
    assert progress(range(3)).disable is (not shown)

def test_show_overrides_the_guess(place):
    place(tty=True)
    assert progress(range(3), show=False).disable
    place(tty=False)
    assert not progress(range(3), show=True).disable

def test_items_pass_through_and_the_bar_is_cleared(place, capsys):
    place(forced='1')
    assert list(progress(range(4), desc='epochs')) == [0, 1, 2, 3]
    err = capsys.readouterr().err
    assert 'epochs' in err and err.endswith('\r'), "a finished bar clears its line (leave=False)"

def test_in_a_kernel_the_bar_has_a_fixed_width(place):
    place(kernel=True, session=True)
    assert progress(range(3)).ncols == 80

@pytest.fixture
def blob(tmp_path):
    src = tmp_path / 'blob.bin'; src.write_bytes(bytes(range(256)) * 400)
    return src, hashlib.sha256(src.read_bytes()).hexdigest()

def test_download_shows_the_bar_when_watched(place, capsys, blob, tmp_path):
    place(forced='1')
    src, sha = blob
    download(src.as_uri(), tmp_path / 'out' / 'got.bin', sha)
    assert 'got.bin' in capsys.readouterr().err

@pytest.mark.parametrize('where, verbose', [(dict(nbdev_test=True, tty=True), True), (dict(forced='1'), False)])
def test_download_is_quiet_under_tests_and_when_not_verbose(place, capsys, blob, tmp_path, where, verbose):
    place(**where)
    src, sha = blob
    assert download(src.as_uri(), tmp_path / 'out' / 'got.bin', sha, verbose=verbose).read_bytes() == src.read_bytes()
    assert capsys.readouterr().err == ''
