"""One contender in its own process: `python -m bench.worker WORKLOAD LIBRARY SIZE_JSON`.

The thread count and allocator settings arrive in the environment, set by bench.run before this process starts, so
every library sees them at import. Commands come as JSON lines on stdin; each answer is one JSON line on the
original stdout (anything a library prints goes to stderr instead)."""
import gc, importlib, json, os, sys, tempfile, time, traceback

def _pin(threads):
    "Run on `threads` CPUs at most, whatever thread pools a library starts."
    try:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > threads: os.sched_setaffinity(0, cpus[:threads])
    except (AttributeError, OSError): pass

def _hide(names):
    "Make these modules fail to import, as if not installed (for testing the suite's skip path)."
    for name in filter(None, names.split(',')): sys.modules[name] = None

def _status(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key): return int(line.split()[1]) * 1024
    return None

def _reset_peak():
    "Reset the kernel's record of this process's peak resident size (Linux); False where it cannot."
    try:
        with open('/proc/self/clear_refs', 'w') as f: f.write('5')
        return True
    except OSError: return False

def measure_memory(forward, step, methods=('rss', 'tracemalloc')):
    """Peak (and, where the pullback is a separate call, held) memory of one step above what was resident before it:
    by the process's resident size, and by tracemalloc (which sees NumPy's arrays, not PyTorch's or XLA's)."""
    import tracemalloc
    out = {}
    for method in methods:
        step()                                            # warm-up: lazy allocations, compilation
        gc.collect()
        if method == 'rss':
            if not _reset_peak(): continue
            base = _status('VmRSS')
            if forward:
                backward = forward(); out['rss held'] = _status('VmRSS') - base; backward(); del backward
            else: step()
            out['rss peak'] = _status('VmHWM') - base
        else:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            if forward:
                backward = forward(); out['tracemalloc held'] = tracemalloc.get_traced_memory()[0] - base
                backward(); del backward
            else: step()
            out['tracemalloc peak'] = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
    return out

def main():
    workload, library, size = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    answer = os.fdopen(os.dup(1), 'w', buffering=1)
    os.dup2(2, 1)                                     # stray prints must not corrupt the answers
    threads = int(os.environ.get('FASTAD_BENCH_THREADS', '1'))
    _pin(threads)
    _hide(os.environ.get('FASTAD_BENCH_HIDE', ''))
    def reply(**kw): answer.write(json.dumps(kw) + '\n')
    module = importlib.import_module(f'bench.workloads.{workload}')
    from bench.workloads.common import Skip
    start = time.perf_counter()
    try: contender = module.CONTENDERS[library](size)
    except Skip as e: contender = reply(skipped=str(e))
    except Exception as e: contender = reply(failed=f"failed to set up: {type(e).__name__}: {e}", traceback=traceback.format_exc())
    if contender is not None: reply(version=contender.version, cases=list(contender.cases), note=contender.note,
                setup_s=time.perf_counter() - start, threads=threads, pools=_pools())
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if command['cmd'] == 'quit': break
            if contender is None: reply(error='skipped'); continue
            if command['cmd'] == 'check':                # the first calls: results saved for the comparison
                results, first = {}, {}
                for case, f in contender.cases.items():
                    t = time.perf_counter(); results[case] = f(); first[case] = time.perf_counter() - t
                path = os.path.join(command['dir'], f"{workload}-{library}.json".replace(' ', '_').replace(',', ''))
                with open(path, 'w') as fh: json.dump({c: _plain(r) for c, r in results.items()}, fh)
                reply(path=path, first_s=first)
            elif command['cmd'] == 'probe':
                reply(gflops=_gemm_gflops(contender.gemm or _numpy_gemm()))
            elif command['cmd'] == 'time':
                f, seconds = contender.cases[command['case']], []
                for _ in range(command['calls']):
                    t = time.perf_counter(); f(); seconds.append(time.perf_counter() - t)
                reply(seconds=seconds)
            elif command['cmd'] == 'memory':
                case = command['case']
                reply(memory=measure_memory(contender.forward.get(case), contender.cases[case], command['methods']))
        except Exception as e:
            reply(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())

def _plain(result):
    "A case's result as JSON: None, or [loss, [gradients as nested lists]]."
    if result is None: return None
    loss, grads = result
    return [float(loss), [getattr(g, 'tolist', lambda: g)() for g in grads]]

def _gemm_gflops(gemm, n=1024, repeats=5):
    "Best of `repeats` float32 n x n products in this library, in GFLOP/s."
    gemm()
    best = min(_timed(gemm) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9

def _numpy_gemm(n=1024):
    import numpy as np
    a = np.ones((n, n), np.float32)
    return lambda: a @ a

def _timed(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t

def _pools():
    "The thread pools loaded in this process, as threadpoolctl sees them (when installed)."
    try: from threadpoolctl import threadpool_info
    except ImportError: return []
    return [f"{p['internal_api']} ({p['num_threads']})" for p in threadpool_info()]

if __name__ == '__main__':
    main()
