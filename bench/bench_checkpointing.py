"""What checkpointing saves, and what it costs: 32 Dense layers 256 wide with tanh, batch 4096, float32.

Run:  .venv/bin/python bench/bench_checkpointing.py [--quick] [--rounds N]

For each configuration (store everything, every layer discarding, √n even segments, a plan for the √n
budget): the bytes the pullbacks hold after the forward pass and the peak of a training step above the
parameters and their gradients (tracemalloc, which sees NumPy's buffers), and the time of a step (measured
without the tracer, in interleaved rounds, median; ratios are medians of per-round ratios). Prints the ratios
beside the targets; asserts nothing about time. Where PyTorch is installed, the same model through
`torch.utils.checkpoint.checkpoint_sequential`, its memory read as process RSS in fresh subprocesses.
"""
import argparse, json, math, os, subprocess, sys, time
import numpy as np
import fastad as fd
from fastad.backend import manual_seed, random_normal
from fastad.checkpointing import estimate, even_segments, measure_layers
from fastad.memory import held_bytes, peak_bytes

MiB = 2 ** 20
TARGETS = dict(held=0.25, peak=0.5, time=1.4)


class Sequence(fd.Layer):
    layers: list
    def forward(self, x): return fd.sequenced(x, through=self.layers)


def build(n, width, batch):
    manual_seed(0)
    layers = [fd.Dense(width, width, activation=np.tanh) for _ in range(n)]
    return layers, random_normal((batch, width)), random_normal((batch, width))


def main(n=32, width=256, batch=4096, rounds=5):
    layers, x, target = build(n, width, batch)
    loss = lambda model: fd.mse(model(x), target)
    step = fd.gradient(loss)
    k = round(math.sqrt(n))
    costs = measure_layers(layers, x)
    budget = int(estimate(costs, even_segments(n, k))[0])
    models = {'store everything': Sequence(layers),
              'every layer discarding': Sequence([l.discarding_activations() for l in layers]),
              f'{k} segments (sqrt n)': fd.checkpoint_sequential(layers, segments=k),
              f'plan for {budget / MiB:.0f} MiB': fd.checkpoint_sequential(layers, budget=budget)}
    parameters = sum(l.weight.nbytes + l.bias.nbytes for l in layers)
    for m in models.values(): step(m)                      # warm up; the budget plan measures its layers here
    memory = {name: (held_bytes(loss, m), peak_bytes(step, m)[1] - parameters) for name, m in models.items()}
    names, times = list(models), {name: [] for name in models}
    for r in range(rounds):                                # every round runs every model, order rotating
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter(); step(models[name]); times[name].append(time.perf_counter() - start)
    base = names[0]
    print(f"{n} Dense layers {width} wide, tanh, batch {batch}, float32: activations {batch * width * 4 / MiB:.1f} MiB each, "
          f"parameters {parameters / MiB:.1f} MiB; {rounds} rounds")
    print(f"{'':28}{'held after forward':>20}{'step peak':>12}{'time':>9}{'recomputed':>12}   ratios: held  peak  time")
    for name in names:
        held, peak = memory[name]
        ratio_t = float(np.median([a / b for a, b in zip(times[name], times[base])]))
        plan = getattr(getattr(models[name], 'plan', None), 'segments', None)
        recomputed = estimate(costs, plan)[1] if plan else (n if 'discarding' in name else 0)
        print(f"{name:28}{held / MiB:16.1f} MiB{peak / MiB:8.1f} MiB{np.median(times[name]):8.3f}s{recomputed:12d}"
              f"   {held / memory[base][0]:11.2f} {peak / memory[base][1]:5.2f} {ratio_t:5.2f}")
        if name.startswith(f'{k} segments'):
            got = dict(held=held / memory[base][0], peak=peak / memory[base][1], time=ratio_t)
    print("targets for sqrt n segments: " + ", ".join(
        f"{key} <= {goal}x ({'met' if got[key] <= goal else 'NOT met'}: {got[key]:.2f}x)" for key, goal in TARGETS.items()))
    torch_comparison(n, width, batch, k)


TORCH_CHILD = r"""
import json, resource, sys, time, torch
from torch.utils.checkpoint import checkpoint_sequential
n, width, batch, segments = map(int, sys.argv[1:5])
torch.manual_seed(0); torch.set_num_threads(torch.get_num_threads())
model = torch.nn.Sequential(*[m for _ in range(n) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())])
x, target = torch.randn(batch, width), torch.randn(batch, width)
def step():
    out = checkpoint_sequential(model, 2 * segments, x, use_reentrant=False) if segments else model(x)
    loss = ((out - target) ** 2).mean()
    model.zero_grad(set_to_none=False); loss.backward()
def held_kib():
    "Bytes of the distinct tensors autograd saves in the forward pass, parameters aside: the held bytes."
    params, seen = {q.data_ptr() for q in model.parameters()}, {}
    def pack(t):
        if t.data_ptr() not in params: seen[t.data_ptr()] = t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = checkpoint_sequential(model, 2 * segments, x, use_reentrant=False) if segments else model(x)
    return sum(seen.values()) // 1024
held = held_kib()
def rss_kib(): return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])
for p in model.parameters(): p.grad = torch.zeros_like(p)      # the gradients exist before, as fastad's baseline has them
before = rss_kib()                       # model, data and gradients in memory; no step run yet
times = []
for _ in range(5):
    start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
print(json.dumps(dict(held_kib=held, step_peak_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, time=sorted(times)[2])))
"""


def torch_comparison(n, width, batch, k):
    "PyTorch's eager step and its checkpoint_sequential on the same model, each in a fresh process (RSS)."
    try: import torch  # noqa: F401
    except ImportError:
        print("PyTorch not installed (pip install -e '.[bench]'): skipping its comparison"); return
    runs = {}
    for label, segments in (('pytorch, store everything', 0), (f'pytorch checkpoint_sequential, {k} segments', k)):
        done = subprocess.run([sys.executable, '-c', TORCH_CHILD, str(n), str(width), str(batch), str(segments)],
                              capture_output=True, text=True, timeout=600,
                              # glibc's malloc would keep freed 4 MiB buffers in its heap (its mmap threshold grows as
                              # they are freed), hiding every saving from RSS: a fixed threshold returns them at once
                              env={**os.environ, 'MALLOC_MMAP_THRESHOLD_': str(2 ** 16)})
        if done.returncode != 0: print(f"{label}: failed ({done.stderr.strip().splitlines()[-1:]})"); return
        runs[label] = json.loads(done.stdout)
    base = runs['pytorch, store everything']
    for label, r in runs.items():
        print(f"{label:44} held after forward {r['held_kib'] / 1024:6.1f} MiB ({r['held_kib'] / base['held_kib']:.2f}x)   "
              f"step peak (RSS above model, data, gradients) {r['step_peak_kib'] / 1024:6.1f} MiB "
              f"({r['step_peak_kib'] / base['step_peak_kib']:.2f}x)   step {r['time']:.3f}s ({r['time'] / base['time']:.2f}x)")
    print("How the configurations differ: PyTorch's figure is the process's peak RSS above what it held before the"
          " first step (model, data, gradients), so it includes the first step's one-time allocations and whatever the"
          " C allocator keeps (its held bytes, counted through autograd's saved-tensor hooks, are exact). Its"
          " checkpoint_sequential never recomputes the last segment (its backward frees each saved tensor once used,"
          " so that segment costs nothing to keep); here it is given 2 x the segments because each Linear and each Tanh"
          " is its own module. fastad recomputes every segment of an even split: its tape lives until the backward"
          " pass ends, so a stored segment would hold its activations through all of it.")


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='a smoke test: 8 layers, batch 512')
    p.add_argument('--rounds', type=int, default=5)
    a = p.parse_args()
    if a.quick: main(n=8, width=256, batch=512, rounds=2)
    else: main(rounds=a.rounds)
