"""The benchmark suite's plumbing: one tiny run writes its table and chart, checks results, and reports a missing
peer as skipped. No timing is asserted: the suite prints ratios, it does not judge them."""
import json, math, os, subprocess, sys
from pathlib import Path
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.run import compare                               # noqa: E402

def run_suite(tmp_path, *args, hide=''):
    "python -m bench --quick, one round, into tmp_path; returns (stdout, the JSON results)."
    env = {**os.environ, 'FASTAD_BENCH_HIDE': hide, 'MPLBACKEND': 'Agg'}
    out = subprocess.run([sys.executable, '-m', 'bench', '--quick', '--rounds', '1', '--out', str(tmp_path),
                          '--json', str(tmp_path / 'results.json'), *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout, json.loads((tmp_path / 'results.json').read_text())

def test_one_workload_writes_table_and_chart(tmp_path):
    stdout, results = run_suite(tmp_path, '--only', 'mlp', '--libraries', 'fastad,numpy')
    entries = results['workloads']['mlp']['entries']
    assert entries['fastad']['status'] == 'ok' and entries['numpy']['status'] == 'ok'
    assert 'max rel. error' in entries['fastad']['check']['step']     # checked against hand-written NumPy
    assert entries['fastad']['gflops'] > 0                             # the GEMM probe ran in fastad's process
    table = (tmp_path / 'results.md').read_text()
    assert '| MNIST MLP step 2,000×784→50→1' in table and '×)' in table   # a figure and a ratio fastad / peer
    png = (tmp_path / 'results.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) < 300_000
    assert 'fastad / hand-written' in stdout and 'OPENBLAS_NUM_THREADS=1' in stdout

@pytest.mark.slow   # several generations of processes
def test_rounds_are_shared_among_generations_of_processes(tmp_path):
    stdout, results = run_suite(tmp_path, '--only', 'scalar', '--libraries', 'fastad,numpy', '--processes', '2',
                                '--rounds', '3')
    entries = results['workloads']['scalar']['entries']
    for name in ('fastad', 'numpy'):
        assert entries[name]['status'] == 'ok'
        assert entries[name]['processes'] == 2
        assert len(entries[name]['rounds']['mixed']) == 3           # 2 rounds in the first processes, 1 in the second

def test_paired_times_two_contenders_in_one_process():
    out = subprocess.run([sys.executable, '-m', 'bench.paired', 'scalar', 'fastad', 'numpy', '--rounds', '3'],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'fastad / numpy = ' in out.stdout and 'scalar: mixed' in out.stdout

def test_missing_peer_is_reported_as_skipped(tmp_path):
    stdout, results = run_suite(tmp_path, '--only', 'cnn', '--libraries', 'fastad,numpy,torch', hide='torch')
    torch = results['workloads']['cnn']['entries']['torch']
    assert torch['status'] == 'skipped' and 'PyTorch is not installed' in torch['reason']
    assert 'skipped' in (tmp_path / 'results.md').read_text()
    assert results['workloads']['cnn']['entries']['numpy']['status'] == 'ok'

def test_memory_workload_measures_a_peak(tmp_path):
    _, results = run_suite(tmp_path, '--only', 'memory', '--libraries', 'fastad,numpy')
    memory = results['workloads']['memory']['entries']['fastad']['memory']['step']
    assert memory['tracemalloc peak'] > 0
    assert 'rss peak' in memory or not Path('/proc/self/clear_refs').exists()

def test_compare_accepts_close_and_refuses_wrong_gradients():
    ref = (1.0, [np.ones(3), np.arange(4.0)])
    assert compare((1.0, [np.ones(3) * (1 + 1e-5), np.arange(4.0)]), ref, (1e-3, 1e-4))[0]
    ok, why = compare((1.0, [np.ones(3), np.arange(4.0) * 1.1]), ref, (1e-3, 1e-4))
    assert not ok and 'gradient 1' in why
    assert not compare((1.5, ref[1]), ref, (1e-3, 1e-4))[0]                      # a different loss
    assert not compare((1.0, [np.ones(3)]), ref, (1e-3, 1e-4))[0]                # a gradient missing
    assert not compare((1.0, [np.ones(4), np.arange(4.0)]), ref, (1e-3, 1e-4))[0]   # a wrong shape

@pytest.mark.slow   # trains each optimizer
def test_the_optimizer_comparison_trains_each_optimizer_from_the_same_start():
    from bench import optimizers     # as a package module: bench/ on sys.path would shadow the stdlib's `profile`
    data = tuple(np.asarray(a) for a in optimizers.load_mnist(verbose=False))
    small = (data[0][:640], data[1][:640], data[2][:200], data[3][:200])
    untrained = optimizers.accuracy(optimizers.fresh(), small[2], small[3])
    for make in optimizers.OPTIMIZERS.values():
        acc, loss = optimizers.train(make, small, steps=20)
        assert acc > untrained and np.isfinite(loss)         # each one learned something from the same start

def test_opcodes_counts_the_python_a_step_runs():
    "bench.opcodes: a fixed count per function, more for more work, nothing left traced after."
    import sys
    from bench.opcodes import count
    def step(n):
        total = 0
        for i in range(n): total += i
        return total
    few, many = count(lambda: step(10)), count(lambda: step(100))
    key = next(k for k in few if k[1] == 'step')
    assert many[key] > few[key] > 0 and count(lambda: step(10))[key] == few[key]
    assert sys.gettrace() is None

def test_a_restarted_process_makes_its_first_calls_before_it_is_timed(monkeypatch, tmp_path):
    "A later generation is warmed up as the first is (by the check): a jit compiled in a timed call skewed JAX's rounds."
    from bench import run
    asked = []
    class Fake:
        def __init__(self, workload, name, size, env): self.name = name
        def ask(self, **command): asked.append((self.name, command['cmd'])); return {}
    monkeypatch.setattr(run, 'Worker', Fake)
    entries = {n: run.Entry(n) for n in ('fastad', 'jax')}
    fresh = run.restart_workers('cnn', dict.fromkeys(entries), {}, {}, entries, str(tmp_path))
    assert sorted(fresh) == ['fastad', 'jax'] and asked == [('fastad', 'check'), ('jax', 'check')]

def test_in_place_compares_each_workload_in_a_process_of_its_own():
    "bench.in_place: in-place against out-of-place code, checked equal first, a ratio per workload; no timing judged."
    out = subprocess.run([sys.executable, '-m', 'bench.in_place', '--quick', '--rounds', '2'],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [l for l in out.stdout.splitlines() if 'in-place / out-of-place = ' in l]
    assert len(lines) == 4 and 'one process per workload' in out.stdout, out.stdout
    assert any(l.startswith('MLP training step') for l in lines) and any(l.startswith('layer norm') for l in lines)

def test_floors_split_a_step_into_fixed_pieces_and_what_is_left(capsys):
    "bench.floors: each piece of a step timed alone, their sum, and the rest of the step; no timing is judged."
    from bench.floors import report, scalar_floors, cnn_floors
    assert report('a step', 'µs', {'one piece': 1.0, 'another': 2.0}, 5.0, {'a peer': 2.5}) == 3.0
    out = capsys.readouterr().out
    assert '2.000 µs (40% of the step)' in out and 'fastad / it = 2.00' in out
    scalar, cnn = scalar_floors(repeat=1, number=2_000), cnn_floors(repeat=1, number=3)
    assert any('dispatch' in k for k in scalar[0]) and any('filter' in k for k in cnn[0])
    for pieces, whole, _ in (scalar, cnn):            # figures only, never judged: a piece that is a difference of two
        assert len(pieces) >= 3 and all(math.isfinite(v) for v in (*pieces.values(), whole)), pieces   # timings (the
                                                      # dispatch) can even come out below 0 on a busy machine
