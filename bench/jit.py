"""fd.jit against eager fastad and hand-written NumPy: `python -m bench.jit`, one process per workload, interleaved.

Three workloads of the suite: the MLP step (workload 1: 60,000 x 784 -> 50 -> 1, MSE, float32, the loss and the
parameters' gradients), the tiny CNN step with fastad's layers (workload 3) and the mixed scalar chain of 1,000
operations (workload 2; under jit from a NumPy float64, since a Python float is a static argument). Each workload runs
in a fresh process; within it the contenders take turns, in an order that rotates each round, and the ratios are the
medians of the ratios within a round, so the machine's drift cancels; each ratio also in CPU time (process_time), which
a loaded machine sways less. `--profile` adds where the replay's time goes
(cProfile of the compiled program on the CNN step)."""
import argparse, os, statistics, subprocess, sys, time
from bench import machine                         # imports no numerical library: the thread count is set first

WORKLOADS = ('mlp', 'cnn', 'scalar')

def contenders(workload, quick=False):
    "name -> a call to time, the per-call divisor (operations for the scalar chain), and each contender's first result."
    import numpy as np
    import fastad as fd
    from bench.workloads import mlp, cnn, scalar
    if workload == 'mlp':
        x, y, params = mlp.data(2_000 if quick else 60_000)
        params = tuple(params)
        grads = lambda p, x, y: fd.value_with_gradient(lambda p: mlp.loss_numpy(p, x, y), p)
        fast = fd.jit(grads)
        calls = {'eager fastad': lambda: grads(params, x, y), 'fd.jit': lambda: fast(params, x, y),
                 'hand-written NumPy': lambda: mlp.manual_step(x, y, *params)}
        return calls, 1
    if workload == 'cnn':
        x, labels, (wc, bc, wd, bd) = cnn.data()
        model = fd.Sequential([fd.Conv2D(filter=wc, bias=bc, activation=None),
                               fd.MaxPool2D(pool_size=(cnn.P, cnn.P), strides=(cnn.P, cnn.P)), fd.Flatten(),
                               fd.Dense(weight=wd, bias=bd, activation=None)])
        grads = lambda m, x, labels: fd.value_with_gradient(lambda m: fd.softmax_cross_entropy(m(x), labels), m)
        fast = fd.jit(grads)
        hand = cnn.hand_numpy({}).cases['step']
        calls = {'eager fastad': lambda: grads(model, x, labels), 'fd.jit': lambda: fast(model, x, labels),
                 'hand-written NumPy': hand}
        return calls, 1
    f, _ = scalar.program('mixed')
    chain = lambda x: f(x, np)
    fast, x0 = fd.jit(lambda x: fd.value_with_gradient(chain, x)), np.float64(scalar.X0)
    hand = scalar.python_tape(scalar.sizes(quick)).cases['mixed']
    calls = {'eager fastad': lambda: fd.value_with_gradient(chain, scalar.X0), 'fd.jit': lambda: fast(x0),
             'hand-written tape': hand}
    return calls, 1_000

def _leaves(result):
    import numpy as np, fastad as fd
    value, grads = result
    return [np.asarray(value, np.float64)] + [np.asarray(g, np.float64) for g in fd.tree.flatten(grads, static_ok=True)[0]]

def one(workload, rounds, quick, profile):
    import numpy as np
    calls, per = contenders(workload, quick)
    for _ in range(3): expected, got = _leaves(calls['eager fastad']()), _leaves(calls['fd.jit']())   # traced twice, replayed
    for e, g in zip(expected, got):
        if np.linalg.norm(e - g) > 1e-5 * np.linalg.norm(e) + 1e-12:     # float32 sums of 60,000 rows in another order: 3e-6
            raise SystemExit(f"{workload}: fd.jit disagrees with eager fastad")
    for c in calls.values(): c()
    names = list(calls)
    times, cpu = {n: [] for n in names}, {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            call, k, start, cstart = calls[n], 1, time.perf_counter(), time.process_time()
            while True:                                   # as many calls as fill about 20 ms
                for _ in range(k): call()
                spent = time.perf_counter() - start
                if spent > 0.02: break
                k *= 2; start, cstart = time.perf_counter(), time.process_time()
            times[n].append(spent / k / per)
            cpu[n].append((time.process_time() - cstart) / k / per)   # this process's CPU time: less swayed by a loaded machine
    unit, scale = ('µs/op', 1e6) if per > 1 else ('µs', 1e6) if statistics.median(times['fd.jit']) < 1e-2 else ('ms', 1e3)
    print(f"{workload}: " + ', '.join(f"{n} {statistics.median(t) * scale:.2f} {unit}" for n, t in times.items()))
    for n in names:
        if n != 'fd.jit':
            wall = statistics.median(a / b for a, b in zip(times['fd.jit'], times[n]))
            proc = statistics.median(a / b for a, b in zip(cpu['fd.jit'], cpu[n]))
            print(f"    fd.jit / {n} = {wall:.2f} (CPU time {proc:.2f})")
    if profile: _profile(calls)

def _profile(calls):
    "Where the replay spends: the compiled program alone, by function (cProfile)."
    import cProfile, pstats, io
    fast = [c for n, c in calls.items() if n == 'fd.jit'][0]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200): fast()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats('tottime').print_stats(12)
    print('\n'.join(l for l in out.getvalue().splitlines() if l.strip())[:3000])

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench.jit', description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=15)
    p.add_argument('--quick', action='store_true', help='the MLP on 2,000 rows, 3 rounds')
    p.add_argument('--threads', type=int, default=1, help='threads for BLAS and OpenMP (default: 1, as the suite)')
    p.add_argument('--only', default=','.join(WORKLOADS))
    p.add_argument('--profile', action='store_true')
    p.add_argument('--one', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one: return one(args.one, 3 if args.quick else args.rounds, args.quick, args.profile)
    env = {**os.environ, **machine.thread_environment(args.threads)}
    for w in args.only.split(','):                        # a fresh process per workload
        cmd = [sys.executable, '-m', 'bench.jit', '--one', w, '--rounds', str(args.rounds)] + \
              (['--quick'] if args.quick else []) + (['--profile'] if args.profile else [])
        subprocess.run(cmd, env=env, check=True)

if __name__ == '__main__':
    main()
