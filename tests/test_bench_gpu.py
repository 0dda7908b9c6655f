"""The GPU benchmark's parts that run anywhere: its steps (given NumPy in CuPy's place) compute the same loss and
gradients, a wrong step is reported and not timed, and its table goes into results.md in place of the old one."""
import subprocess, sys
from pathlib import Path
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import gpu                                       # noqa: E402
from bench.report import refresh_gpu_section, GPU_HEADING   # noqa: E402
from fastad.backend import gpu_available                    # noqa: E402

@pytest.mark.parametrize('size', list(gpu.CNNS))
def test_the_cnn_steps_agree(size):
    "fastad's layers and the hand-written step (im2col by strides, pooling by a mask) give the same loss and gradients."
    fastad, hand = gpu.cnn_fastad(np, **gpu.CNNS[size]), gpu.cnn_hand(np, **gpu.CNNS[size])
    assert gpu.max_error(fastad(), hand()) < 1e-5

def test_the_mlp_steps_agree():
    assert gpu.max_error(gpu.mlp_fastad(np)(), gpu.mlp_hand(np)()) < 1e-5

def test_a_step_that_disagrees_is_reported_and_not_timed():
    hand = gpu.cnn_hand(np, **gpu.CNNS['tiny CNN'])
    def wrong():
        loss, grads = hand()
        return loss, (grads[0] * 1.01, *grads[1:])            # one gradient 1 % off
    rows = gpu.measure('tiny', {'fastad': wrong, 'hand-written CuPy': hand}, lambda: None, rounds=2)
    by_name = {name: (t, check) for _, name, t, _, check in rows}
    assert by_name['fastad'][0] is None and by_name['fastad'][1].startswith('disagrees: max rel. error 1')
    assert by_name['hand-written CuPy'][0] > 0 and by_name['hand-written CuPy'][1] == 'the reference'

def test_a_step_that_raises_is_reported():
    hand = gpu.cnn_hand(np, **gpu.CNNS['tiny CNN'])
    def broken(): raise TypeError("no such kernel")
    rows = gpu.measure('tiny', {'broken': broken, 'hand-written CuPy': hand}, lambda: None, rounds=1)
    assert ('tiny', 'broken', None, None, 'failed: TypeError: no such kernel') in rows

def test_the_gpu_table_replaces_the_old_one_in_results_md(tmp_path):
    results = tmp_path / 'results.md'
    results.write_text('# results\n\n| cpu | table |\n\n## On a GPU\n\nold figures\n\n## Per process\n\n| rows |\n')
    table = tmp_path / 'results_gpu.md'
    table.write_text('Device: X\n\n| new | figures |\n')
    refresh_gpu_section(results, table)
    once = results.read_text()
    assert 'old figures' not in once and '| new | figures |' in once and once.count(GPU_HEADING) == 1
    assert once.startswith('# results\n\n| cpu | table |\n') and once.rstrip().endswith('## Per process\n\n| rows |')
    refresh_gpu_section(results, table)
    assert results.read_text() == once                      # a second run changes nothing

def test_results_md_without_a_gpu_section_gets_one_before_the_next(tmp_path):
    results = tmp_path / 'results.md'
    results.write_text('# results\n\n| cpu |\n\n## Per process\n\n| rows |\n')
    (tmp_path / 'results_gpu.md').write_text('| gpu |\n')
    refresh_gpu_section(results, tmp_path / 'results_gpu.md')
    text = results.read_text()
    assert text.index('| cpu |') < text.index(GPU_HEADING) < text.index('| gpu |') < text.index('## Per process')

@pytest.mark.skipif(gpu_available(), reason="a GPU is here: the benchmark would run")
def test_without_a_gpu_it_says_so_and_measures_nothing(tmp_path):
    out = subprocess.run([sys.executable, '-m', 'bench.gpu', '--out', str(tmp_path / 'gpu.md')], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and 'CuPy cannot use a GPU here' in out.stderr and not (tmp_path / 'gpu.md').exists()

def test_rounds_time_each_step_per_call_and_the_ratio_is_fastad_over_the_other(monkeypatch):
    "On a clock that only the steps move, a step three times as slow shows 3x in its figure and in the ratio."
    clock, synced = [0.0], []
    monkeypatch.setattr(gpu.time, 'perf_counter', lambda: clock[0])
    def fastad(): clock[0] += 0.003
    def other(): clock[0] += 0.001
    rows = gpu.measure('fake', {'fastad': lambda: (fastad(), (1.0, [np.ones(2)]))[1],
                                'hand-written CuPy': lambda: (other(), (1.0, [np.ones(2)]))[1]},
                       lambda: synced.append(1), rounds=4)
    by_name = {name: (t, ratio) for _, name, t, ratio, _ in rows}
    assert by_name['fastad'][0] == pytest.approx(0.003) and by_name['hand-written CuPy'][0] == pytest.approx(0.001)
    assert by_name['hand-written CuPy'][1] == pytest.approx(3.0)
    assert len(synced) >= 2 * 4 * 2                          # each batch starts and ends with a synchronisation

@pytest.mark.parametrize('text', ['# results\n\n| cpu |\nfootnote\n## On a GPU\nold\n', '# results\n\n| cpu |\nlast line\n'])
def test_refreshing_keeps_every_other_line_however_the_file_is_spaced(tmp_path, text):
    results, table = tmp_path / 'results.md', tmp_path / 'results_gpu.md'
    results.write_text(text); table.write_text('| gpu |\n')
    refresh_gpu_section(results, table); once = results.read_text()
    refresh_gpu_section(results, table)
    assert results.read_text() == once and once.endswith('| gpu |\n') and 'old' not in once
    assert ('footnote' in once) == ('footnote' in text) and ('last line' in once) == ('last line' in text)

@pytest.mark.parametrize('size', list(gpu.CNNS))
def test_pytorchs_steps_agree_where_it_runs_here(size):
    "The PyTorch steps the GPU benchmark times (on the CPU here): the same loss and gradients as the hand-written ones."
    torch = pytest.importorskip('torch')
    assert gpu.max_error(gpu.cnn_torch(torch, **gpu.CNNS[size], device='cpu')(), gpu.cnn_hand(np, **gpu.CNNS[size])()) < 1e-4
    if size == 'tiny CNN': assert gpu.max_error(gpu.mlp_torch(torch, device='cpu')(), gpu.mlp_hand(np)()) < 1e-4
