"""The backend toggle: switching, the environment variable, the GPU fallback, array creation and transfer."""
import os, subprocess, sys
import numpy as np, pytest
import fastad
from fastad import backend as B
from fastad.errors import BackendError
from fastad.strict import StrictArray

def run_python(code, **env):
    "Run `code` in a fresh interpreter with extra environment variables; return the completed process."
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})

@pytest.fixture(autouse=True)
def start_on_numpy(monkeypatch):
    "Each test starts on NumPy with no FASTAD_BACKEND set, whatever backend the suite itself runs under."
    monkeypatch.delenv('FASTAD_BACKEND', raising=False)
    with B.use_backend('numpy'): yield

def test_default_is_numpy():
    out = run_python("import fastad, numpy; print(fastad.get_backend(), fastad.backend.xp() is numpy)")
    assert out.returncode == 0 and out.stdout.split() == ['numpy', 'True']

def test_lessons_toggle_off_keeps_the_environments_backend():
    code = "import fastad; print(fastad.backend.use_gpu(False), fastad.backend.environment_backend())"
    assert run_python(code, FASTAD_BACKEND=' Strict ').stdout.split() == ['strict', 'strict']
    assert run_python(code).stdout.split() == ['numpy', 'None']

def test_backend_names_ignore_case_and_spaces():
    with B.use_backend(' STRICT '): assert B.get_backend() == 'strict'

def test_set_backend_returns_previous_and_switches():
    assert B.set_backend('strict') == 'numpy'
    try: assert B.get_backend() == 'strict' and type(B.zeros(2)) is StrictArray
    finally: B.set_backend('numpy')

def test_use_backend_restores_after_error():
    with pytest.raises(ZeroDivisionError):
        with B.use_backend('strict'): 1 / 0
    assert B.get_backend() == 'numpy'

def test_nested_use_backend():
    with B.use_backend('strict'):
        with B.use_backend('numpy'): assert B.get_backend() == 'numpy'
        assert B.get_backend() == 'strict'

def test_unknown_backend_names_the_choices():
    with pytest.raises(BackendError, match="unknown backend 'torch': choose one of 'numpy', 'cupy', 'strict'"): B.set_backend('torch')
    assert B.get_backend() == 'numpy'

@pytest.mark.skipif(B.gpu_available(), reason="this machine has a usable GPU")
def test_cupy_without_gpu_is_one_clear_error():
    with pytest.raises(BackendError) as e: B.set_backend('cupy')
    assert ("not installed" in str(e.value) and "fastad[gpu]" in str(e.value)) or "GPU" in str(e.value)
    assert e.value.__cause__ is None and e.value.__suppress_context__    # no chained CUDA traceback
    assert B.get_backend() == 'numpy'

@pytest.mark.skipif(B.gpu_available(), reason="this machine has a usable GPU")
def test_use_gpu_falls_back_in_one_line(capsys):
    assert B.use_gpu(True) == 'numpy'
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Using NumPy:")
    assert B.use_gpu(False) == 'numpy' and capsys.readouterr().out == ''

def test_environment_variable_picks_backend():
    out = run_python("import fastad; print(fastad.get_backend())", FASTAD_BACKEND='strict')
    assert out.returncode == 0 and out.stdout.strip() == 'strict'

def test_bad_environment_variable_fails_at_import_naming_it():
    out = run_python("import fastad", FASTAD_BACKEND='tpu')
    assert out.returncode != 0 and "FASTAD_BACKEND='tpu': unknown backend 'tpu'" in out.stderr

@pytest.mark.skipif(B.gpu_available(), reason="this machine has a usable GPU")
def test_cupy_environment_variable_without_gpu():
    out = run_python("import fastad", FASTAD_BACKEND='cupy')
    assert out.returncode != 0 and "FASTAD_BACKEND='cupy'" in out.stderr
    assert 'cudaError' not in out.stderr and 'CUDARuntimeError' not in out.stderr

def test_creation_functions(any_backend):
    for a in (B.zeros((2, 3)), B.ones(4), B.random_normal((3,)), B.asarray([1., 2.], dtype=np.float32)):
        assert B.array_module(a) is any_backend and a.dtype == np.float32
    assert B.array_module(B.arange(5)) is any_backend and B.to_host(B.arange(5)).tolist() == [0, 1, 2, 3, 4]

def test_seeded_generators_reproduce(any_backend):
    a = B.random_normal((4, 4), rng=B.default_rng(7))
    assert np.array_equal(B.to_host(a), B.to_host(B.random_normal((4, 4), rng=B.default_rng(7))))
    B.manual_seed(3); b = B.to_host(B.random_normal(5)); B.manual_seed(3)
    assert np.array_equal(b, B.to_host(B.random_normal(5)))
    assert B.random_normal(3, dtype=np.float64).dtype == np.float64

def test_round_trips(any_backend):
    host = np.arange(6.).reshape(2, 3)
    dev = B.to_device(host)
    assert B.array_module(dev) is any_backend and np.array_equal(B.to_host(dev), host)
    assert B.to_host({'a': [dev, 1.0]})['a'][0].tolist() == host.tolist()
    assert B.is_array(dev) and not B.is_array(1.0) and not B.is_array(np.float32(1))

def test_array_module_of_mixed_arguments():
    assert B.array_module(np.ones(2), 1.0) is np
    with B.use_backend('strict') as strict: assert B.array_module(np.ones(2), B.ones(2)) is strict

def test_synchronize_on_cpu_waits_for_nothing_and_loads_no_cupy(any_backend):
    "With no GPU in use it returns at once, without importing CuPy (which would start a CUDA context)."
    had_cupy = 'cupy' in sys.modules
    assert B.synchronize() is None
    assert ('cupy' in sys.modules) == had_cupy

def test_public_names_are_exported():
    for name in ('set_backend', 'use_backend', 'get_backend', 'use_gpu', 'gpu_available', 'to_host', 'to_device'):
        assert callable(getattr(fastad, name))

def test_timed_waits_for_the_device_before_every_clock_read(monkeypatch):
    from fastad import timing
    events = []
    monkeypatch.setattr(timing, 'synchronize', lambda: events.append('sync'))
    clock = timing.time.perf_counter
    monkeypatch.setattr(timing.time, 'perf_counter', lambda: events.append('clock') or clock())
    timing.timed(lambda: events.append('run'), repeat=3, warmup=1, quiet=True)
    # warm-up, wait; then for each run: clock, run, wait, clock
    assert events == ['run', 'sync'] + ['clock', 'run', 'sync', 'clock'] * 3

def test_synchronize_waits_only_once_cupy_is_in_use(monkeypatch):
    waited = []
    fake = type(sys)('cupy')
    fake.cuda = type(sys)('cupy.cuda')
    fake.cuda.get_current_stream = lambda: type('Stream', (), {'synchronize': lambda self: waited.append(1)})()
    monkeypatch.setitem(sys.modules, 'cupy', fake)
    monkeypatch.setattr(B, '_cupy_loaded', False)         # as in a process that never chose CuPy (on a GPU, conftest has)
    B.synchronize(); assert waited == []                  # CuPy imported but never used as a backend: nothing to wait for
    monkeypatch.setattr(B, '_cupy_loaded', True)
    B.synchronize(); assert waited == [1]                 # used once: arrays may be on the GPU, whatever is active now

def test_creation_refuses_what_is_not_an_array_of_numbers(any_backend):
    from fastad.errors import ArgumentError
    with pytest.raises(ArgumentError, match="to_device: x holds <U1 values, not numbers"): B.to_device(['a', 'b'])
    with pytest.raises(ArgumentError, match="to_device: cannot make an array of numbers from list"): B.to_device([[1.0], [1.0, 2.0]])
    with pytest.raises(ArgumentError, match="to_device: dtype=object was asked for, not numbers"): B.to_device(B.ones(2), dtype=object)
    with pytest.raises(ArgumentError, match=r"ones: shape must be .* got \(2, -1\)"): B.ones((2, -1))
    with pytest.raises(ArgumentError, match="random_normal: dtype must be a floating-point type"): B.random_normal(2, dtype=np.int32)
    assert B.array_module(B.random_normal(2, rng=np.random.default_rng(0))) is B.xp()

def test_to_host_keeps_named_tuples():
    from collections import namedtuple
    P = namedtuple('P', 'a b')
    with B.use_backend('strict'): back = B.to_host(P(B.ones(2), 3))
    assert type(back) is P and type(back.a) is np.ndarray and back.b == 3

def test_creation_refuses_bad_dtypes_and_generators():
    from fastad.errors import ArgumentError
    with pytest.raises(ArgumentError, match="zeros: dtype must be a numeric type, got 'floot'"): B.zeros(2, dtype='floot')
    with pytest.raises(ArgumentError, match="ones: dtype must be a numeric type, got object"): B.ones(2, dtype=object)
    with pytest.raises(ArgumentError, match="random_normal: rng must be a random generator"): B.random_normal(2, rng=3)
