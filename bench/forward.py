"""Forward mode's cost: `python -m bench.forward`, a differential against a pullback, alternately in one process.

fastad's differential is the pullback of the pullback (no forward rule per primitive). This measures what that
costs against reverse mode on two of the suite's workloads: the scalar chain (workload 2, mixed: sin, × 0.5, + 0.1,
exp on a Python float) and the MLP step (workload 1, float32). Each side is the whole call from the arguments:
`value_with_pullback(f, x)` then the pullback of the cotangent 1; `value_with_differential(f, x)` then the
differential of a tangent shaped like `x`. The ratio is the median of the ratios within a round (see bench.paired),
of wall-clock time and of the thread's CPU time, and the ratio of the fastest calls: on a machine shared with other
work, the CPU time is the steadier."""
import argparse, os, statistics, time
from bench import machine                         # imports no numerical library: the thread count is set first

def cases(quick=False):
    "name -> (reverse, forward, check): two calls to time, and a check that the JVP is the gradient along the tangent."
    import numpy as np
    import fastad as fd
    from bench.workloads import mlp, scalar
    f, _ = scalar.program('mixed')
    chain = lambda x: f(x, np)
    x0, t0 = scalar.X0, 0.7
    rows = 2_000 if quick else 60_000
    xs, ys, params = mlp.data(rows)
    params = tuple(params)
    loss = lambda p: mlp.loss_numpy(p, xs, ys)
    tangent = tuple(np.random.default_rng(1).standard_normal(p.shape).astype(np.float32) for p in params)
    def check_chain():
        return abs(fd.differential(chain, x0)(t0) - fd.gradient(chain, x0) * t0) <= 1e-12 * abs(fd.gradient(chain, x0) * t0) + 1e-15
    def check_mlp():
        jvp, grads = fd.differential(loss, params)(tangent), fd.gradient(loss, params)
        expected = sum(float((g.astype(np.float64) * t).sum()) for g, t in zip(grads, tangent))
        return abs(float(jvp) - expected) <= 2e-3 * abs(expected) + 1e-6
    return {
        'scalar chain, 1,000 ops': (lambda: fd.value_with_pullback(chain, x0)[1](1.0),
                                    lambda: fd.value_with_differential(chain, x0)[1](t0), check_chain),
        f'MLP step, {rows:,} rows': (lambda: fd.value_with_pullback(loss, params)[1](np.float32(1)),
                                     lambda: fd.value_with_differential(loss, params)[1](tangent), check_mlp),
    }

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench.forward', description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=25)
    p.add_argument('--quick', action='store_true', help='the MLP on 2,000 rows')
    p.add_argument('--threads', type=int, default=1, help='threads for BLAS and OpenMP (default: 1, as the suite)')
    args = p.parse_args(argv)
    os.environ.update(machine.thread_environment(args.threads))
    for name, (reverse, forward, check) in cases(args.quick).items():
        if not check(): raise SystemExit(f"{name}: the differential disagrees with the gradient")
        reverse(); forward()                                   # warm-up
        wall, cpu = {'pullback': [], 'differential': []}, {'pullback': [], 'differential': []}
        for r in range(args.rounds):
            for n, run in (('pullback', reverse), ('differential', forward))[::1 if r % 2 else -1]:
                t, c = time.perf_counter(), time.thread_time()
                run()
                cpu[n].append(time.thread_time() - c); wall[n].append(time.perf_counter() - t)
        ratio = {k: statistics.median(a / b for a, b in zip(s['differential'], s['pullback'])) for k, s in (('wall', wall), ('cpu', cpu))}
        medians = ', '.join(f"{n} {statistics.median(s) * 1e3:.3f} ms" for n, s in wall.items())
        fastest = min(wall['differential']) / min(wall['pullback'])
        print(f"{name}: {medians}; differential / pullback = {ratio['wall']:.2f} wall-clock, {ratio['cpu']:.2f} CPU time "
              f"(medians of {args.rounds} paired rounds), {fastest:.2f} between the fastest calls")

if __name__ == '__main__':
    main()
