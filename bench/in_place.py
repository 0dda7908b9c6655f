"""In-place writes against out-of-place code: `python -m bench.in_place [mlp] [layer_norm] [--rounds 25] [--quick]`.

The same computation written twice, as NumPy code is written: with in-place writes (`h += b`, `h *= mask`,
`c -= c.mean(...)`, `c /= ...`, and `w -= lr * g` for the update) and without (`h = h + b` ...). Each side is
the whole call under `fd.value_with_gradient` (for the MLP, a training step: the gradient, then the update of the
plain parameters). Workloads: lesson 02's MLP training step (workload 1's sizes: 60,000 × 784 → 50 → 1, float32)
and a layer norm whose loss is the mean square of its output, on a (4096, 256) float32 batch and a (32, 64) one
(where each operation's bookkeeping shows, not the kernels); and, to see that bookkeeping alone, a chain of 20
`c *= m` against `c = c * m` on a (32, 64) array. Each workload runs in a process of its own; within it the
two sides alternate, round after round, who goes first alternating too, and the ratio in-place / out-of-place is the
median of the ratios within a round, of wall-clock and of the thread's CPU time (see bench.paired). Nothing is
asserted about a time: the ratios are printed; the goal is at most 1.10."""
import argparse, os, statistics, subprocess, sys, time
from bench import machine                         # imports no numerical library: the thread count is set first

WORKLOADS = ('mlp', 'layer_norm', 'layer_norm_small', 'chain')

def mlp_sides(quick=False, lr=0.01):
    "(in-place step, out-of-place step, check): lesson 02's training step, each returning the loss."
    import numpy as np
    import fastad as fd
    from bench.workloads import mlp
    xs, ys, params = mlp.data(2_000 if quick else 60_000)
    def loss_out(p):
        w1, b1, w2, b2 = p
        l1 = xs @ w1 + b1
        l2 = l1 * (l1 > 0)
        diff = (l2 @ w2 + b2)[:, 0] - ys
        return (diff * diff).mean()
    def loss_in(p):
        w1, b1, w2, b2 = p
        h = xs @ w1
        h += b1
        h *= h > 0
        out = h @ w2
        out += b2
        diff = out[:, 0] - ys
        diff *= diff
        return diff.mean()
    kept = {'out': [p.copy() for p in params], 'in': [p.copy() for p in params]}
    def step_out():
        p = kept['out']
        loss, g = fd.value_with_gradient(loss_out, tuple(p))
        kept['out'] = [w - lr * gw for w, gw in zip(p, g)]
        return loss
    def step_in():
        p = kept['in']
        loss, g = fd.value_with_gradient(loss_in, tuple(p))
        for w, gw in zip(p, g): w -= lr * gw
        return loss
    def check():
        p = tuple(params)
        (a, ga), (b, gb) = fd.value_with_gradient(loss_in, p), fd.value_with_gradient(loss_out, p)
        return np.isclose(a, b, rtol=1e-5) and all(np.allclose(u, v, rtol=2e-3, atol=1e-4 * np.abs(v).max()) for u, v in zip(ga, gb))
    return step_in, step_out, check

def layer_norm_sides(shape):
    "(in-place, out-of-place, check): a layer norm's loss and its gradients with respect to x, gain and bias."
    import numpy as np
    import fastad as fd
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    gain, bias = np.ones(shape[-1], np.float32), np.zeros(shape[-1], np.float32)
    def out_of_place(x, gain, bias):
        c = x - x.mean(-1, keepdims=True)
        c = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
        c = c * gain + bias
        return (c * c).mean()
    def in_place(x, gain, bias):
        c = x.copy()                                   # the caller's x keeps its values, as in NumPy
        c -= c.mean(-1, keepdims=True)
        c /= np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5)
        c *= gain
        c += bias
        c *= c
        return c.mean()
    def check():
        (a, ga), (b, gb) = (fd.value_with_gradient(f, x, gain, bias) for f in (in_place, out_of_place))
        return np.isclose(a, b, rtol=1e-5) and all(np.allclose(u, v, rtol=2e-3, atol=1e-4 * np.abs(v).max()) for u, v in zip(ga, gb))
    return (lambda: fd.value_with_gradient(in_place, x, gain, bias), lambda: fd.value_with_gradient(out_of_place, x, gain, bias),
            check)

def chain_sides(shape, n=20):
    "(in-place, out-of-place, check): `c *= m` n times against `c = c * m`: what the engine's `x op= y` path adds per operation."
    import numpy as np
    import fastad as fd
    x, m = np.random.default_rng(0).standard_normal(shape, dtype=np.float32), np.float32(0.5)
    def in_place(x):
        c = x * m
        for _ in range(n): c *= m
        return c.sum()
    def out_of_place(x):
        c = x * m
        for _ in range(n): c = c * m
        return c.sum()
    def check():
        (a, ga), (b, gb) = fd.value_with_gradient(in_place, x), fd.value_with_gradient(out_of_place, x)
        return a == b and np.array_equal(ga, gb)
    return lambda: fd.value_with_gradient(in_place, x), lambda: fd.value_with_gradient(out_of_place, x), check

def sides(workload, quick=False):
    if workload == 'chain': return "20 multiplications of a 32×64 array, c *= m against c = c * m", chain_sides((32, 64))
    if workload == 'mlp': return f"MLP training step, {2_000 if quick else 60_000:,}×784→50→1", mlp_sides(quick)
    shape = {'layer_norm': (4096, 256), 'layer_norm_small': (32, 64)}[workload] if not quick else {'layer_norm': (32, 64), 'layer_norm_small': (8, 16)}[workload]
    return f"layer norm {shape[0]}×{shape[1]}, with its gradients", layer_norm_sides(shape)

def paired(in_place, out_of_place, rounds, seconds=0.05):
    "Per round, each side runs as many calls as fill about `seconds`, who goes first alternating: (wall, cpu) per call."
    in_place(); out_of_place()                                       # warm-up
    t = time.perf_counter(); out_of_place(); number = max(1, round(seconds / max(time.perf_counter() - t, 1e-9)))
    wall, cpu = {'in': [], 'out': []}, {'in': [], 'out': []}
    for r in range(rounds):
        for name, run in (('in', in_place), ('out', out_of_place))[::1 if r % 2 else -1]:
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(number): run()
            cpu[name].append((time.thread_time() - c) / number); wall[name].append((time.perf_counter() - t) / number)
    return wall, cpu

def measure(workload, rounds, quick=False):
    "Time one workload here, in this process; print one line and return the ratios."
    title, (in_place, out_of_place, check) = sides(workload, quick)
    if not check(): raise SystemExit(f"{title}: the in-place version disagrees with the out-of-place one")
    wall, cpu = paired(in_place, out_of_place, rounds)
    ratio = {k: statistics.median(a / b for a, b in zip(s['in'], s['out'])) for k, s in (('wall', wall), ('cpu', cpu))}
    unit, scale = ('ms', 1e3) if min(wall['out']) > 1e-3 else ('µs', 1e6)
    print(f"{title}: in-place {statistics.median(wall['in']) * scale:.3f} {unit}, out-of-place "
          f"{statistics.median(wall['out']) * scale:.3f} {unit}; in-place / out-of-place = {ratio['wall']:.3f} wall-clock, "
          f"{ratio['cpu']:.3f} CPU time (medians of {rounds} paired rounds)", flush=True)
    return ratio

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench.in_place', description=__doc__.splitlines()[0])
    p.add_argument('workloads', nargs='*', default=list(WORKLOADS), help=f"any of {', '.join(WORKLOADS)} (default: all)")
    p.add_argument('--rounds', type=int, default=25)
    p.add_argument('--quick', action='store_true', help='tiny sizes (the figures mean little)')
    p.add_argument('--threads', type=int, default=1, help='threads for BLAS and OpenMP (default: 1, as the suite)')
    p.add_argument('--here', action='store_true', help='time the workloads in this process (the parent starts one per workload)')
    args = p.parse_args(argv)
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown: p.error(f"unknown workload {', '.join(sorted(unknown))}: choose from {', '.join(WORKLOADS)}")
    env = machine.thread_environment(args.threads)
    os.environ.update(env)
    if args.here:
        for w in args.workloads: measure(w, args.rounds, args.quick)
        return
    print(f"threads: {args.threads}; one process per workload")
    for w in args.workloads:                                           # a fresh process for each workload
        cmd = [sys.executable, '-m', 'bench.in_place', w, '--here', '--rounds', str(args.rounds), '--threads', str(args.threads)]
        done = subprocess.run(cmd + (['--quick'] if args.quick else []), env={**os.environ, **env}, capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        if done.returncode: raise SystemExit(f"{w} failed:\n{done.stderr[-3000:]}")

if __name__ == '__main__':
    main()
