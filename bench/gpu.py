"""The MLP and CNN training steps on a GPU: fastad on CuPy against the same step written by hand in CuPy and against
PyTorch CUDA eager. `python -m bench.gpu` checks every contender's first result against the hand-written one, times
them in interleaved rounds in one process (each batch of calls closed by a device synchronisation), prints the table and
writes it to bench/results_gpu.md, which `bench/results.md` shows under "On a GPU"."""
import argparse, datetime, statistics, sys, time
from pathlib import Path
import numpy as np
from .workloads import cnn, mlp

HERE = Path(__file__).resolve().parent
CLASSES, POOL = cnn.CLASSES, cnn.P
CNNS = {'tiny CNN': dict(n=10, h=16, c=3, k=5, f=6),          # workload 3's step, as on the CPU
        'CNN, batch 256': dict(n=256, h=32, c=3, k=5, f=32)}  # enough work for a GPU to show

def cnn_data(n, h, c, k, f):
    "A CNN step's batch, labels and parameters (conv filter, bias, dense weight, bias), on the host: workload 3's, resized."
    return cnn.data(n, h, c, k, f)

def host(loss, grads):
    "(float, [NumPy arrays]) from CuPy or PyTorch values."
    to_host = lambda a: a.get() if hasattr(a, 'get') else a.detach().cpu().numpy() if hasattr(a, 'detach') else np.asarray(a)
    return float(to_host(loss)), [np.asarray(to_host(g)) for g in grads]

# --- the MLP step (workload 1) ---

def mlp_fastad(cp):
    import fastad as fd
    x, y, params = mlp.data(rows=60_000)
    x, y, params = cp.asarray(x), cp.asarray(y), tuple(cp.asarray(p) for p in params)
    return lambda: fd.value_with_gradient(lambda p: mlp.loss_numpy(p, x, y), params)

def mlp_hand(cp):
    "Lesson 02's manual backward in CuPy: the parameters' gradients only (the CPU suite's hand-written step)."
    x, y, params = mlp.data(rows=60_000)
    x, y, params = cp.asarray(x), cp.asarray(y), [cp.asarray(p) for p in params]
    return lambda: mlp.manual_step(x, y, *params)

def mlp_torch(torch, device='cuda'): return mlp.torch_step(torch, *mlp.data(rows=60_000), device=device)

# --- a CNN step (workload 3's network at two sizes) ---

def cnn_fastad(cp, n, h, c, k, f):
    import fastad as fd
    x, labels, params = cnn_data(n, h, c, k, f)
    x, labels, (wc, bc, wd, bd) = cp.asarray(x), cp.asarray(labels), [cp.asarray(p) for p in params]
    model = [fd.Conv2D(filter=wc, bias=bc, activation=None), fd.MaxPool2D(pool_size=(POOL, POOL), strides=(POOL, POOL)),
             fd.Flatten(), fd.Dense(weight=wd, bias=bd, activation=None)]
    loss = lambda m: fd.softmax_cross_entropy(fd.sequenced(x, through=m), labels)
    def step():
        value, (gc, _, _, gd) = fd.value_with_gradient(loss, model)
        return value, (gc.filter, gc.bias, gd.weight, gd.bias)
    return step

def cnn_hand(cp, n, h, c, k, f):
    "Forward and backward by hand in CuPy: im2col by strides, one GEMM per product, pooling by a mask."
    x, labels, params = cnn_data(n, h, c, k, f)
    x, (wc, bc, wd, bd) = cp.asarray(x), [cp.asarray(p) for p in params]
    ho = h - k + 1; hp = ho // POOL; flat = hp * hp * f
    onehot = cp.eye(CLASSES, dtype=cp.float32)[cp.asarray(labels)]
    wmat, rows = wc.reshape(k * k * c, f), cp.arange(n)
    s = x.strides
    def step():
        cols = cp.lib.stride_tricks.as_strided(x, (n, ho, ho, k, k, c), (s[0], s[1], s[2], s[1], s[2], s[3]))
        cols = cols.reshape(n * ho * ho, k * k * c)
        windows = (cols @ wmat + bc).reshape(n, hp, POOL, hp, POOL, f)
        pooled = windows.max(axis=(2, 4), keepdims=True)
        flat_ = pooled.reshape(n, flat)
        logits = flat_ @ wd + bd
        shifted = logits - logits.max(1, keepdims=True)
        e = cp.exp(shifted)
        total = e.sum(1, keepdims=True)
        loss = (cp.log(total)[:, 0] - (shifted * onehot).sum(1)).mean()
        g_logits = (e / total - onehot) / n
        g_pooled = (g_logits @ wd.T).reshape(n, hp, 1, hp, 1, f)
        g_conv = ((windows == pooled) * g_pooled).reshape(n * ho * ho, f)     # ties have probability zero here
        return loss, ((cols.T @ g_conv).reshape(k, k, c, f), g_conv.sum(0), flat_.T @ g_logits, g_logits.sum(0))
    return step

def cnn_torch(torch, n, h, c, k, f, device='cuda'): return cnn.torch_step(torch, *cnn_data(n, h, c, k, f), device=device)

# --- checking and timing ---

def max_error(result, reference):
    "The largest relative error of the loss and of each gradient (scaled by its largest element) against the reference."
    (l, gs), (lr, grs) = host(*result), host(*reference)
    errors = [abs(l - lr) / max(abs(lr), 1e-12)]
    for g, gr in zip(gs, grs, strict=True):
        errors.append(float(np.abs(g - gr).max() / max(np.abs(gr).max(), 1e-12)))
    return max(errors)

def time_rounds(steps, synchronize, rounds, budget=0.02):
    """Seconds per call of each step, per round: every round times each step once, in an order that rotates, for as
    many calls as fill `budget` seconds, the batch closed by a device synchronisation (so the GPU may run one call
    while Python queues the next, as in training). The ratio of two steps is the median of their ratios within a round."""
    calls = {}
    for name, step in steps.items():                  # warm up, and size each request
        step(); synchronize()
        t = time.perf_counter(); step(); synchronize()
        calls[name] = max(1, int(budget / max(time.perf_counter() - t, 1e-6)))
    names, per_round = list(steps), []
    for r in range(rounds):
        times = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            synchronize(); t = time.perf_counter()
            for _ in range(calls[name]): steps[name]()
            synchronize()
            times[name] = (time.perf_counter() - t) / calls[name]
        per_round.append(times)
    return per_round

def measure(title, steps, synchronize, rounds, reference='hand-written CuPy', tolerance=2e-3):
    "Check each step's first result against the reference, time those that agree; return a table row per contender."
    failed = lambda e: f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    try: ref = steps[reference]()
    except Exception as e: return [(title, reference, None, None, failed(e) + ' (the reference: nothing timed)')]
    good, rows = {}, []
    for name, step in steps.items():
        try:
            err = 0.0 if name == reference else max_error(step(), ref)
        except Exception as e:
            rows.append((title, name, None, None, failed(e))); continue
        if err > tolerance: rows.append((title, name, None, None, f"disagrees: max rel. error {err:.1e}")); continue
        good[name] = (step, 'the reference' if name == reference else f"max rel. error {err:.0e}")
    per_round = time_rounds({n: s for n, (s, _) in good.items()}, synchronize, rounds)
    for name, (_, check) in good.items():
        t = statistics.median(r[name] for r in per_round)
        ratio = statistics.median(r['fastad'] / r[name] for r in per_round) if 'fastad' in good else None
        rows.append((title, name, t, ratio, check))
    return rows

# --- the run ---

def environment(cp, torch):
    "The device and the versions the figures depend on."
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props['name'].decode() if isinstance(props['name'], bytes) else props['name']
    import fastad
    return dict(device=f"{name}, {props['totalGlobalMem'] / 2**30:.0f} GiB", cuda=cp.cuda.runtime.runtimeGetVersion(),
                cupy=cp.__version__, torch=torch.__version__ if torch else 'not installed', fastad=fastad.__version__,
                python=sys.version.split()[0], numpy=np.__version__)

def run(rounds):
    import cupy as cp
    import fastad as fd
    try: import torch
    except ImportError: torch = None
    if torch is not None and not torch.cuda.is_available(): torch = None
    if torch is not None:                            # float32 as CuPy computes it: no TF32 in matrix products or convolutions
        torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
    def synchronize():
        cp.cuda.get_current_stream().synchronize()
        if torch is not None: torch.cuda.synchronize()
    rows = []
    with fd.use_backend('cupy'):
        workloads = {'MLP step 60,000×784→50→1': (mlp_fastad, mlp_hand, mlp_torch, {})}
        for title, size in CNNS.items():
            label = f"{title} [{size['n']},{size['h']},{size['h']},{size['c']}], conv {size['k']}×{size['k']}×{size['c']}→{size['f']}"
            workloads[label] = (cnn_fastad, cnn_hand, cnn_torch, size)
        for title, (fastad_, hand, torch_, size) in workloads.items():
            steps = {'fastad': fastad_(cp, **size), 'hand-written CuPy': hand(cp, **size)}
            if torch is not None: steps['PyTorch CUDA eager'] = torch_(torch, **size)
            rows += measure(title, steps, synchronize, rounds)
            print(f"{title}: done", file=sys.stderr)
    return environment(cp, torch), rows

def fmt_time(t): return f"{t * 1e3:,.2f} ms" if t >= 1e-3 else f"{t * 1e6:,.0f} µs"

def markdown(env, rows, rounds):
    lines = [f"Generated by `python -m bench.gpu` on {datetime.date.today().isoformat()}; do not edit by hand. "
             f"Device: {env['device']}; CUDA runtime {env['cuda']}, CuPy {env['cupy']}, PyTorch {env['torch']}, "
             f"fastad {env['fastad']}, Python {env['python']}, NumPy {env['numpy']}. float32, no TF32. One process, "
             f"{rounds} interleaved rounds, each batch of calls closed by a device synchronisation; figures are medians "
             "of the seconds per call, "
             "and *fastad / it* is the median of the ratios within a round (above 1: fastad is slower).", '',
             '| workload | contender | per step | fastad / it | first-call check |', '|---|---|---|---|---|']
    for title, name, t, ratio, check in rows:
        lines.append(f"| {title} | {name} | {fmt_time(t) if t else '—'} | "
                     f"{'' if ratio is None or name == 'fastad' else f'{ratio:.2f}×'} | {check} |")
    return '\n'.join(lines) + '\n'

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rounds', type=int, default=30)
    ap.add_argument('--out', type=Path, default=HERE / 'results_gpu.md', help='where the table goes')
    args = ap.parse_args(argv)
    if args.rounds < 1: ap.error('--rounds must be 1 or more')
    from fastad.backend import gpu_available
    if not gpu_available(): sys.exit("bench.gpu: CuPy cannot use a GPU here (fd.set_backend('cupy') says why); nothing measured")
    env, rows = run(args.rounds)
    text = markdown(env, rows, args.rounds)
    print(text)
    args.out.write_text(text)
    if args.out == HERE / 'results_gpu.md':           # the suite's own table: shown in results.md too
        from .report import refresh_gpu_section
        refresh_gpu_section(HERE / 'results.md', args.out)

if __name__ == '__main__': main()
