"""Two contenders of one workload timed alternately in one process: `python -m bench.paired mlp fastad numpy`.

The suite gives each library a process of its own (thread pools of one library slow another's). Two contenders on
the same NumPy and BLAS can share one, and then the process's own luck (where its memory landed) is the same for
both: the median ratio says what the code costs, with nothing of the process in it."""
import argparse, importlib, os, statistics, time
from bench import machine                         # imports no numerical library: the thread count is set first

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench.paired', description=__doc__.splitlines()[0])
    p.add_argument('workload'); p.add_argument('a'); p.add_argument('b')
    p.add_argument('--case', default=None, help="the workload's case (default: its first)")
    p.add_argument('--rounds', type=int, default=25)
    p.add_argument('--threads', type=int, default=1, help='threads for BLAS and OpenMP (default: 1, as the suite)')
    args = p.parse_args(argv)
    os.environ.update(machine.thread_environment(args.threads))
    module = importlib.import_module(f'bench.workloads.{args.workload}')
    size = module.sizes(False)
    a, b = (module.CONTENDERS[n](size) for n in (args.a, args.b))
    case = args.case or next(iter(a.cases))
    runs = {args.a: a.cases[case], args.b: b.cases[case]}
    for run in runs.values(): run()                          # the first calls: warm-up
    seconds = {n: [] for n in runs}
    for r in range(args.rounds):
        for n in (list(runs) if r % 2 else list(runs)[::-1]):  # alternate who goes first
            t = time.perf_counter(); runs[n](); seconds[n].append(time.perf_counter() - t)
    ratio = statistics.median(x / y for x, y in zip(*seconds.values()))
    for n, s in seconds.items(): print(f"{n:12s} median {statistics.median(s) * 1e3:9.3f} ms   min {min(s) * 1e3:9.3f} ms")
    print(f"{args.a} / {args.b} = {ratio:.3f} (median of {args.rounds} paired rounds, {args.workload}: {case})")

if __name__ == '__main__':
    main()
