"""fastad against hand-written NumPy, PyTorch eager, JAX jit and HIPS autograd: `python -m bench` (see bench/README.md).

Each library runs in a fresh process of its own, all with the same thread count; rounds are interleaved (every
round asks every process once, in an order that rotates); each figure is a median (minimum beside it), each ratio
fastad / peer the median of the ratios within a round. Results go to bench/results.md and bench/results.png."""
import argparse, math, json, os, subprocess, sys, tempfile, time
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))                 # `python bench/run.py` works as well as `python -m bench`
from bench import machine                     # noqa: E402
from bench import report                      # noqa: E402

WORKLOADS = ('mlp', 'scalar', 'cnn', 'memory', 'checkpointing')
PEERS = ('numpy', 'torch', 'jax', 'autograd')
LIBRARY_OF = {'floor': 'numpy'}
NUMPY_BASED = ('fastad', 'numpy', 'autograd')               # a contender's library, for --libraries: 'fastad, gc off' is fastad's
# correctness on the first call: the loss and every gradient within these tolerances of the reference's
TOLERANCE = {'mlp': (2e-3, 1e-4), 'scalar': (1e-9, 1e-12), 'cnn': (2e-3, 1e-4), 'memory': (2e-3, 1e-4),
             'checkpointing': (2e-3, 1e-4)}

def library_of(name): return LIBRARY_OF.get(name, name.split(',')[0])

class WorkerDied(RuntimeError): pass

class Worker:
    "One contender's process: ask it a command, read its one-line JSON answer."
    def __init__(self, workload, name, size, env):
        self.name, self.log = name, tempfile.TemporaryFile('w+')
        self.proc = subprocess.Popen([sys.executable, '-m', 'bench.worker', workload, name, json.dumps(size)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT,
                                     env=env, text=True)
        self.hello = self.read()

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            raise WorkerDied(f"{self.name}: the process ended: {self.log.read()[-2000:]}")
        return json.loads(line)

    def ask(self, **command):
        self.proc.stdin.write(json.dumps(command) + '\n'); self.proc.stdin.flush()
        answer = self.read()
        if 'error' in answer: raise WorkerDied(f"{self.name}: {answer['error']}\n{answer.get('traceback', '')}")
        return answer

    def close(self):
        try:
            self.proc.stdin.write('{"cmd": "quit"}\n'); self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception: self.proc.kill()

@dataclass
class Entry:
    "What one contender gave on one workload."
    name: str
    status: str = 'ok'                      # ok, skipped, failed
    reason: str = ''
    version: str = ''
    note: str = ''
    gflops: float = None
    pools: list = field(default_factory=list)
    check: dict = field(default_factory=dict)       # case -> 'ok (max rel. error ...)' or the reference's name
    rounds: dict = field(default_factory=dict)      # case -> [per-round median seconds]
    calls: dict = field(default_factory=dict)       # case -> [every call's seconds]
    memory: dict = field(default_factory=dict)      # case -> {method: bytes}
    processes: int = 0                              # how many processes of this contender were timed

def compare(result, reference, tolerance):
    "The largest error relative to the reference's scale, or a message saying what differs."
    rtol, atol = tolerance
    loss, grads = result
    ref_loss, ref_grads = reference
    if not np.isclose(loss, ref_loss, rtol=rtol, atol=atol): return False, f"loss {loss!r} vs {ref_loss!r}"
    if len(grads) != len(ref_grads): return False, f"{len(grads)} gradients vs {len(ref_grads)}"
    worst = 0.0
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        if g.shape != r.shape: return False, f"gradient {i}: shape {g.shape} vs {r.shape}"
        scale = max(float(np.abs(r).max()), 1e-30)
        err = float(np.abs(g - r).max()) / scale
        if not np.allclose(g, r, rtol=rtol, atol=atol * scale): return False, f"gradient {i}: max rel. error {err:.1e}"
        worst = max(worst, err)
    return True, f"max rel. error {worst:.0e}"

def start_workers(workload, names, size, env, out):
    workers, entries = {}, {}
    for name in names:
        entry = entries[name] = Entry(name)
        try: w = Worker(workload, name, size, env)
        except WorkerDied as e:
            entry.status, entry.reason = 'failed', str(e); continue
        if 'skipped' in w.hello or 'failed' in w.hello:
            entry.status = 'skipped' if 'skipped' in w.hello else 'failed'
            entry.reason = w.hello[entry.status]; w.close()
            out(f"  {name:24s} {entry.status}: {entry.reason}")
            if 'traceback' in w.hello: out(w.hello['traceback'])
            continue
        entry.version, entry.note, entry.pools = w.hello['version'], w.hello['note'], w.hello['pools']
        entry.processes = 1
        workers[name] = w
    return workers, entries

def check_all(workload, workers, entries, tmp, out):
    "Every contender's first call, compared with the reference: hand-written NumPy's where there is one, else fastad's."
    results = {}
    for name, w in list(workers.items()):
        try:
            with open(w.ask(cmd='check', dir=tmp)['path']) as f: results[name] = json.load(f)
        except WorkerDied as e:
            entries[name].status, entries[name].reason = 'failed', str(e).splitlines()[0]
            w.close(); del workers[name]
    for name in list(workers):
        for case, result in results[name].items():
            if result is None: entries[name].check[case] = 'nothing to check (a floor)'; continue
            ref = next((r for r in ('numpy', 'fastad') + tuple(results)
                        if r in results and results[r].get(case) is not None), None)
            if ref == name: entries[name].check[case] = 'the reference'; continue
            ok, message = compare(result, results[ref][case], TOLERANCE[workload])
            entries[name].check[case] = f"{message} against {ref}"
            if not ok:
                entries[name].status, entries[name].reason = 'failed', f"{case}: wrong result: {message} against {ref}"
                out(f"  {name:24s} FAILED the check on {case}: {message} against {ref}")
                workers.pop(name).close()
                break

def time_rounds(module, workers, entries, rounds, gap, target, out, share=1.0):
    """Interleaved rounds: each round asks every process for each case once, in an order that rotates. `share`: the
    part of the workload's rounds these processes run (a long case's fewer rounds are shared out the same way)."""
    names = list(workers)
    cases = list(dict.fromkeys(c for w in workers.values() for c in w.hello['cases']))
    calls = {}
    for name, w in workers.items():                           # calls per request: about `target` seconds' worth
        for case in w.hello['cases']:
            one = w.ask(cmd='time', case=case, calls=1)['seconds'][0]
            if one < 0.1: one = min(one, w.ask(cmd='time', case=case, calls=1)['seconds'][0])
            calls[name, case] = max(1, min(200, int(target / max(one, 1e-9))))
    rounds_for = getattr(module, 'rounds_for', lambda case, rounds: rounds)
    total = round(rounds / share)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for case in cases:
            for name in order:
                if case not in workers[name].hello['cases'] or r >= math.ceil(rounds_for(case, total) * share): continue
                if gap: time.sleep(gap)
                seconds = workers[name].ask(cmd='time', case=case, calls=calls[name, case])['seconds']
                entries[name].rounds.setdefault(case, []).append(float(np.median(seconds)))
                entries[name].calls.setdefault(case, []).extend(seconds)

def probe(module, workers, entries):
    "Each process's GEMM speed (the best of the probes of all its processes is kept)."
    for name, w in workers.items():
        if gap := getattr(module, 'GAP', 0): time.sleep(gap)
        gflops = w.ask(cmd='probe')['gflops']
        entries[name].gflops = gflops if entries[name].gflops is None else max(entries[name].gflops, gflops)

def restart_workers(workload, workers, size, env, entries, tmp):
    """A fresh process for every contender still running. One process can be a few per cent faster or slower than
    another running the same code (where its memory landed), which would bias a comparison timed in one process
    each; the timed rounds are shared among several generations of processes, so that bias averages out. Each new
    process makes its first calls (the check's, into `tmp`) before it is timed, as the first generation does: else
    a jit compiled in its first timed call sets how many calls it is asked for per round, and JAX's CNN step ran
    at half speed (680 against 300 µs per call) in every generation after the first."""
    fresh = {}
    for name in workers:
        try:
            fresh[name] = Worker(workload, name, size, env)
            fresh[name].ask(cmd='check', dir=tmp)
            entries[name].processes += 1
        except WorkerDied as e: entries[name].status, entries[name].reason = 'failed', str(e)
    return fresh

def paired_ratio(a, b):
    "Median over rounds of a/b, each round's pair measured back to back."
    n = min(len(a), len(b))
    return float(np.median(np.array(a[:n]) / np.array(b[:n]))) if n else None

def run_workload(workload, args, env, tmp, out):
    module = __import__(f'bench.workloads.{workload}', fromlist=['_'])
    size = module.sizes(args.quick)
    names = [n for n in module.CONTENDERS if library_of(n) in args.libraries]
    out(f"\n== {workload}: {module.TITLE.format(**size)}")
    kind = getattr(module, 'KIND', 'time')
    if kind.startswith('memory'): env = {**env, **machine.MEMORY_ENVIRONMENT}
    workers, entries = start_workers(workload, names, size, env, out)
    try:
        check_all(workload, workers, entries, tmp, out)
        probe(module, workers, entries)
        if kind.startswith('memory'):
            for name, w in workers.items():
                # tracemalloc sees NumPy's arrays only: not PyTorch's or XLA's, nor anything in checkpointing's rows
                methods = ['rss'] + (['tracemalloc'] if library_of(name) in NUMPY_BASED and workload == 'memory' else [])
                for case in w.hello['cases']:
                    entries[name].memory[case] = w.ask(cmd='memory', case=case, methods=methods)['memory']
        if kind != 'memory' and workers:
            rounds = args.rounds or (getattr(module, 'ROUNDS', 15) if not args.quick else 2)
            generations = max(1, min(args.processes or (1 if args.quick else 3), rounds))
            for g in range(generations):              # fresh processes for each share of the rounds: see below
                if g:
                    for w in workers.values(): w.close()
                    workers = restart_workers(workload, workers, size, env, entries, tmp)
                    probe(module, workers, entries)
                share = rounds // generations + (g < rounds % generations)
                time_rounds(module, workers, entries, share, 0 if args.quick else getattr(module, 'GAP', 0.1),
                            0.02 if args.quick else getattr(module, 'TARGET', 0.05), out, share / rounds)
    finally:
        for w in workers.values(): w.close()
    wl = {'workload': workload, 'title': module.TITLE.format(**size), 'size': size, 'unit': module.UNIT,
          'entries': {n: e.__dict__ for n, e in entries.items()}}
    out()
    for e in wl['entries'].values(): report.print_entry(wl, e, out)
    report.print_ratios(workload, wl, out)
    return wl

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench', description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='tiny sizes and 2 rounds: a smoke test (figures mean little)')
    p.add_argument('--only', default=','.join(WORKLOADS), help=f"comma-separated workloads (default: all of {', '.join(WORKLOADS)})")
    p.add_argument('--libraries', default='fastad,' + ','.join(PEERS), help='comma-separated libraries (default: all)')
    p.add_argument('--rounds', type=int, default=None, help='interleaved rounds (default: 15, fewer for long cases; 2 with --quick)')
    p.add_argument('--processes', type=int, default=None, help='fresh processes per contender, one after another, that share the rounds (default: 3; 1 with --quick)')
    p.add_argument('--threads', type=int, default=1, help='threads for every library (default: 1, see bench/README.md)')
    p.add_argument('--out', default=str(ROOT / 'bench'), help='folder for results.md and results.png (default: bench/)')
    p.add_argument('--json', default=None, help='also write every figure to this JSON file')
    args = p.parse_args(argv)
    args.libraries = set(args.libraries.split(','))
    workloads = [w for w in args.only.split(',') if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown: p.error(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    out = lambda line='': print(line, flush=True)
    env = {**os.environ, **machine.thread_environment(args.threads), 'FASTAD_BENCH_THREADS': str(args.threads),
           'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep)}
    facts = machine.describe(args.threads)
    out("fastad benchmark suite" + (" (--quick: tiny sizes, the figures mean little)" if args.quick else ''))
    for k, v in facts.items(): out(f"  {k}: {v}")
    out("  every process: " + ' '.join(f"{k}={v}" for k, v in machine.thread_environment(args.threads).items())
        + f", torch.set_num_threads({args.threads}), pinned to {args.threads} CPU(s)")
    started = time.time()
    results = {'machine': facts, 'quick': args.quick, 'workloads': {}}
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads:
            results['workloads'][workload] = run_workload(workload, args, env, tmp, out)
    results['seconds'] = time.time() - started
    outdir = Path(args.out); outdir.mkdir(parents=True, exist_ok=True)
    report.write_markdown(results, outdir / 'results.md')
    report.write_chart(results, outdir / 'results.png')
    if args.json: Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    out(f"\nwrote {outdir / 'results.md'} and {outdir / 'results.png'} ({results['seconds']:.0f} s)")
    if outdir.resolve() == (ROOT / 'bench').resolve():    # the README shows the table's headline rows: keep it in step
        done = subprocess.run([sys.executable, str(ROOT / 'tools' / 'make_readme.py')], capture_output=True, text=True)
        out(done.stdout.strip() if done.returncode == 0 else
            f"README.md not updated (run python tools/make_readme.py): {done.stderr.strip()[-300:]}")

if __name__ == '__main__':
    main()
