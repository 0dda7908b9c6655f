#!/usr/bin/env bash
# The GPU checks, on a machine where CuPy sees an NVIDIA GPU:
#   1. the benchmark `python -m bench.gpu` (MLP and CNN steps: fastad on CuPy, hand-written CuPy, PyTorch CUDA), alone;
#   2. every test that runs on each backend, on CuPy (pytest -k cupy);
#   3. every lesson on CuPy with its GPU-only cells (nbdev_test --flags gpu, FASTAD_BACKEND=cupy).
# 2 and 3 run side by side. Each step's log goes to $LOGS (default gpu_logs/); the last lines say what passed.
# PYTHON names the interpreter (default .venv/bin/python); WORKERS the processes each of 2 and 3 may use.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
LOGS=${LOGS:-gpu_logs}; WORKERS=${WORKERS:-4}
mkdir -p "$LOGS"
bin=$("$PYTHON" -c 'import sys, os; print(os.path.dirname(sys.executable))')
export MPLBACKEND=Agg PYTHONUNBUFFERED=1

"$PYTHON" -c "import fastad.backend as B; B.set_backend('cupy'); print('CuPy runs on', B.xp().cuda.runtime.getDeviceProperties(0)['name'].decode())" \
  || { echo "gpu_check: the cupy backend cannot run here"; exit 1; }

echo "== 1. python -m bench.gpu"
timeout -k 30 240 "$PYTHON" -m bench.gpu --rounds "${ROUNDS:-20}" >"$LOGS/bench_gpu.log" 2>&1; bench=$?
tail -n 20 "$LOGS/bench_gpu.log"

echo "== 2 and 3. the tests on CuPy; the lessons on CuPy"
backend_tests=$(grep -l any_backend tests/test_*.py)
xdist=$("$PYTHON" -c 'import xdist' 2>/dev/null && echo "-n $WORKERS")
timeout -k 30 420 "$PYTHON" -m pytest -q -p no:cacheprovider $xdist -k cupy $backend_tests >"$LOGS/pytest_cupy.log" 2>&1 &
tests_pid=$!
trap 'kill $tests_pid 2>/dev/null' EXIT INT TERM        # interrupted: the tests in the background stop too
FASTAD_BACKEND=cupy timeout -k 30 420 "$bin/nbdev_test" --flags gpu --n_workers "$WORKERS" >"$LOGS/lessons_cupy.log" 2>&1; lessons=$?
wait $tests_pid; tests=$?

echo "-- pytest on CuPy (exit $tests):"; tail -n 25 "$LOGS/pytest_cupy.log"
echo "-- lessons on CuPy (exit $lessons):"; tail -n 40 "$LOGS/lessons_cupy.log"
echo "gpu_check: bench $bench, tests $tests, lessons $lessons (0 is a pass)"
[ $bench -eq 0 ] && [ $tests -eq 0 ] && [ $lessons -eq 0 ]
