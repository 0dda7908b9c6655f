"""The machine a run measured, and one thread count for every library (set before any of them is imported)."""
import os, platform, sys

THREAD_VARIABLES = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'VECLIB_MAXIMUM_THREADS',
                    'NUMEXPR_NUM_THREADS', 'BLIS_NUM_THREADS')

def available_cores():
    "CPUs this process may run on (fewer than the machine's when pinned)."
    try: return len(os.sched_getaffinity(0))
    except AttributeError: return os.cpu_count() or 1

def thread_environment(threads):
    "Environment variables that give every BLAS, OpenMP and XLA pool `threads` threads."
    env = {name: str(threads) for name in THREAD_VARIABLES}
    # XLA's CPU client sizes its pools by the cores it may use; intra-op threads are its knob for the rest
    env['XLA_FLAGS'] = (f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
                        f"intra_op_parallelism_threads={threads}")
    env['JAX_PLATFORMS'] = 'cpu'
    env['TF_CPP_MIN_LOG_LEVEL'] = '2'
    return env

# for memory workloads only (it slows allocation): every block over 128 KiB is mapped on its own and unmapped when
# freed, so a process's resident size follows its live arrays instead of what the allocator kept for later
MEMORY_ENVIRONMENT = {'MALLOC_MMAP_THRESHOLD_': '131072', 'MALLOC_TRIM_THRESHOLD_': '131072'}

def cpu_model():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'): return line.split(':', 1)[1].strip()
    except OSError: pass
    return platform.processor() or platform.machine()

def numpy_blas():
    "The BLAS NumPy was built with, and what threadpoolctl sees loaded (when it is installed)."
    import numpy as np
    blas = '?'
    try:
        info = np.show_config(mode='dicts')['Build Dependencies']['blas']
        blas = f"{info.get('name', '?')} {info.get('version', '')}".strip()
    except Exception: pass
    try:
        from threadpoolctl import threadpool_info
        pools = [f"{p['internal_api']} {p.get('version') or ''} ({p['num_threads']} threads, {p.get('threading_layer', '?')})"
                 for p in threadpool_info()]
        if pools: blas += '; loaded: ' + ', '.join(pools)
    except ImportError: pass
    return blas

def describe(threads):
    "A dict of the facts a reader needs to compare two runs."
    import numpy as np
    return {'cpu': cpu_model(), 'cores': os.cpu_count(), 'cores available': available_cores(), 'threads': threads,
            'python': sys.version.split()[0], 'numpy': np.__version__, 'blas': numpy_blas(),
            'platform': platform.platform()}
