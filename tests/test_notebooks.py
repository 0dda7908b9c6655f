"""Every lesson on the other backends: on the strict backend, which refuses silent host copies as CuPy does
(so a lesson that would break on a GPU breaks here), and on a GPU, GPU-only cells included, where CuPy can run."""
import os, subprocess, sys
from pathlib import Path
import pytest
from fastad.backend import gpu_available

ROOT = Path(__file__).resolve().parent.parent

def run_lessons(backend, *flags):
    "Run every notebook with nbdev_test, the lessons' toggle cells picking `backend`; return the finished process."
    env = {**os.environ, 'FASTAD_BACKEND': backend, 'MPLBACKEND': 'Agg'}
    nbdev_test = Path(sys.executable).parent / 'nbdev_test'
    return subprocess.run([str(nbdev_test), *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)

def test_every_lesson_runs_on_the_strict_backend():
    done = run_lessons('strict')
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

@pytest.mark.skipif(not gpu_available(), reason="needs a GPU that CuPy can use")
def test_every_lesson_runs_on_the_gpu_with_its_gpu_cells():
    done = run_lessons('cupy', '--flags', 'gpu')
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
