"""What a step costs before fastad's own bookkeeping: `python -m bench.floors [scalar] [cnn] [--repeat 7]`.

Part of a step's time is fixed by choices fastad has made, and no trimming of the engine moves it:
* the scalar chain (workload 2, mixed): NumPy's `__array_ufunc__` dispatch, the only way `np.sin(x)` reaches a traced
  value; the rules' own calls (each VWC returns its value and builds its chains); calling those chains in the sweep;
* the tiny CNN step (workload 3, fastad's layers): NumPy's kernels, each timed alone on the step's own arrays (the
  pooling and softmax rules whole, with their few argument checks).
What is left of a step is the engine's and the transforms' own work, the part that trimming can still reach. Each
figure is the best of `--repeat` timeit repeats, so each piece is a floor; compare them within one run. The peers'
whole steps are in the suite's table (`python -m bench`), each measured in a process of its own."""
import argparse, os, timeit
from bench import machine                         # imports no numerical library: the thread count is set first

def best(f, number, repeat, names=None):
    """Seconds per call: the best of `repeat` timings of `number` calls of `f`, a function, or a statement that reads
    `names` (timed as written: no frame of ours around the call)."""
    return min(timeit.repeat(f, number=number, repeat=repeat, globals=names)) / number

class _Dispatched:
    "A type whose `__array_ufunc__` does nothing: what NumPy's dispatch alone costs."
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs): return inputs[0]

def _handler(ufunc, method, *inputs, **kwargs):
    "The same do-nothing handler, called directly: the Python call that dispatch ends in."
    return inputs[0]

def scalar_floors(repeat=7, number=100_000):
    "{piece: µs per operation} for the mixed chain (sin, × 0.5, + 0.1, exp), the whole step, and a minimal tape."
    import numpy as np
    import fastad as fd
    from fastad.primitives import REGISTRY
    from bench.workloads import scalar
    time = lambda statement, **names: best(statement, number, repeat, names)
    d, x = _Dispatched(), 0.3
    dispatch = time('sin(d)', sin=np.sin, d=d) - time("handler(sin, '__call__', d)", handler=_handler, sin=np.sin, d=d)
    calls = [(np.sin, (x,)), (np.multiply, (x, 0.5)), (np.add, (x, 0.1)), (np.exp, (x,))]   # x * 0.5 and x + 0.1
    rules = [time('vwc(*a)', vwc=REGISTRY[f].rule.vwc, a=a) for f, a in calls]            # go to `apply_scalar`,
    kept = [REGISTRY[f].rule.vwc(*a)[1] for f, a in calls]                                   # which keeps x's chain
    chains = [time('chain(1.0)', chain=c[0] if isinstance(c, tuple) else c) for c in kept]
    f, _ = scalar.program('mixed')
    ops = scalar.cases_ops('mixed')
    whole = best(lambda: fd.value_with_gradient(lambda x: f(x, np), x), 20, repeat) / ops
    minimal = best(scalar.CONTENDERS['numpy'](scalar.sizes(True)).cases['mixed'], 20, repeat) / ops
    pieces = {"NumPy's ufunc dispatch (2 of 4 operations)": dispatch / 2, 'the rules (VWC calls)': sum(rules) / 4,
              'their chains, called in the sweep': sum(chains) / 4}
    return {k: v * 1e6 for k, v in pieces.items()}, whole * 1e6, {'a minimal pure-Python tape': minimal * 1e6}

def cnn_floors(repeat=7, number=500):
    "{kernel: µs} for the tiny CNN step with fastad's layers, each timed alone on the step's arrays, and the whole step."
    import numpy as np
    from fastad import cnn
    from bench.workloads import cnn as work
    x, labels, (wc, bc, wd, bd) = work.data()
    plain = dict(strides=(1, 1), amounts=((0, 0), (0, 0)))
    conv = cnn._conv_value(x, wc, **plain) + bc
    pooled, scatter = cnn.max_pool2d_vwc(conv)
    flat = pooled.reshape(len(x), -1)
    logits = flat @ wd + bd
    _, (dlogits, _) = cnn.softmax_cross_entropy_vwc(logits, labels)
    g_logits = dlogits(np.float32(1))
    g_pooled = (g_logits @ wd.T).reshape(pooled.shape)
    g_conv = scatter(g_pooled)
    ones = lambda n: np.ones(n, np.float32)
    kernels = {
        'convolution: window rows, product, bias': lambda: cnn._conv_value(x, wc, **plain) + bc,
        'max pool: value and winners': lambda: cnn.max_pool2d_vwc(conv),
        'dense: product and bias': lambda: flat @ wd + bd,
        'softmax cross-entropy and its chain': lambda: cnn.softmax_cross_entropy_vwc(logits, labels)[1][0](np.float32(1)),
        "dense's cotangents (weight, bias, input)": lambda: (flat.T @ g_logits, ones(len(g_logits)) @ g_logits, g_logits @ wd.T),
        "max pool's scatter": lambda: scatter(g_pooled),
        "filter's cotangent, rebuilt from the input": lambda: cnn._conv_dfilter_value(x, g_conv, size=wc.shape[:2], **plain),
        "convolution bias's cotangent": lambda: ones(g_conv.size // g_conv.shape[-1]) @ g_conv.reshape(-1, g_conv.shape[-1]),
    }
    pieces = {k: best(f, number, repeat) * 1e6 for k, f in kernels.items()}
    whole = best(work.fastad_layers(None).cases['step'], number, repeat) * 1e6
    return pieces, whole, {}                          # the peers' whole steps: the suite's table, each in its own process

def report(title, unit, pieces, whole, peers):
    "Print each piece, their sum, the whole step and what is left of it."
    print(f"== {title}")
    width = max(map(len, [*pieces, *peers])) + 2
    for name, v in pieces.items(): print(f"  {name:{width}s} {v:8.3f} {unit}")
    fixed = sum(pieces.values())
    print(f"  {'the pieces together':{width}s} {fixed:8.3f} {unit}")
    print(f"  {'fastad, the whole step':{width}s} {whole:8.3f} {unit}")
    print(f"  {'left: the engine and transforms':{width}s} {whole - fixed:8.3f} {unit} ({(whole - fixed) / whole:.0%} of the step)")
    for name, v in peers.items(): print(f"  {name:{width}s} {v:8.3f} {unit} (fastad / it = {whole / v:.2f})")
    return fixed

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench.floors', description=__doc__.splitlines()[0])
    p.add_argument('workloads', nargs='*', default=['scalar', 'cnn'], help='scalar, cnn or both (default: both)')
    p.add_argument('--repeat', type=int, default=7, help='timeit repeats; the best is kept (default: 7)')
    args = p.parse_args(argv)
    unknown = set(args.workloads) - {'scalar', 'cnn'}
    if unknown: p.error(f"unknown workload {', '.join(sorted(unknown))}: choose scalar, cnn or both")
    os.environ.update(machine.thread_environment(1))   # one thread, as the suite
    if 'scalar' in args.workloads:
        report('scalar chain, mixed (sin, × 0.5, + 0.1, exp): per operation', 'µs', *scalar_floors(args.repeat))
    if 'cnn' in args.workloads:
        report("tiny CNN step with fastad's layers", 'µs', *cnn_floors(args.repeat))

if __name__ == '__main__':
    main()
