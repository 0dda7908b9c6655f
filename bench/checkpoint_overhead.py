"""What a checkpoint costs: a checkpointed call against the plain one, timed alternately in one process (medians
and their ratio), and the bytes a pullback holds (tracemalloc): a cell in a loop, and a convolution with tanh,
plain against discarding. `python bench/checkpoint_overhead.py`; with `PYTHONPATH=<another checkout>` it
measures that checkout's fastad instead."""
import statistics, time
import numpy as np
import fastad as fd
from fastad.backend import random_normal, manual_seed
from fastad.memory import held_bytes

def paired(runs, rounds):
    "Median seconds of each run, timed alternately, and the median ratio of the second to the first."
    seconds = {n: [] for n in runs}
    for r in range(rounds):
        for n in (list(runs) if r % 2 else list(runs)[::-1]):
            t = time.perf_counter(); runs[n](); seconds[n].append(time.perf_counter() - t)
    a, b = seconds.values()
    return [statistics.median(s) for s in (a, b)], statistics.median(y / x for x, y in zip(a, b))

def main():
    print(fd.__file__)
    x, ck = np.full((16, 64), 0.1), fd.make_recomputed_in_gradient(np.tanh)
    plain, checkpointed = (lambda x: np.tanh(x).sum()), (lambda x: ck(x).sum())
    for what in (fd.value_with_pullback, fd.gradient):
        (p, c), ratio = paired({'plain': lambda: what(plain, x), 'checkpointed': lambda: what(checkpointed, x)}, 3000)
        print(f"{what.__name__:20s} plain {p * 1e6:6.1f} us, checkpointed {c * 1e6:6.1f} us: "
              f"ratio {ratio:.2f}, a checkpoint costs {(c - p) * 1e6:.0f} us")
    manual_seed(0)
    w, h = random_normal((64, 64)) / 8, random_normal((16, 64))
    cell = lambda h: np.tanh(h @ w)
    def loop(c):
        def f(h):
            for _ in range(40): h = c(h)
            return h.sum()
        return f
    print(f"a cell in a loop, 40 steps, held: plain {held_bytes(loop(cell), h) / 1e3:.0f} KB, "
          f"checkpointed {held_bytes(loop(fd.make_recomputed_in_gradient(cell)), h) / 1e3:.0f} KB")
    x = random_normal((32, 28, 28, 3))
    conv = fd.Conv2D(filter_shape=(5, 5, 3, 32), activation=np.tanh)
    print(f"Conv2D 5x5x3x32 + tanh on 32x28x28x3, loss c(x).sum(), held: plain "
          f"{held_bytes(lambda c: c(x).sum(), conv) / 1e6:.2f} MB, discarding "
          f"{held_bytes(lambda c: c(x).sum(), conv.discarding_activations()) / 1e6:.3f} MB")

if __name__ == '__main__':
    main()
