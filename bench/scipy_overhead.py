"""What fastad's SciPy rules cost a plain call: each SciPy function on plain arrays with the rules in force (its code
redirected through `fastad.derivative`) and without them (`unregister_scipy`), timed alternately in one process
(medians and the median ratio). Each round switches the rules on or off, warms up (a switch swaps a function's code,
and Python's specialising interpreter starts over), then times a batch of calls. `python bench/scipy_overhead.py [rounds]`."""
import statistics, sys, time
import numpy as np
import fastad as fd
from scipy import special, stats, linalg, signal
from fastad import scipy_rules

rng = np.random.default_rng(0)
x, small, a = rng.standard_normal(1000), rng.standard_normal(3), rng.standard_normal((30, 30))
cov = a @ a.T / 30 + np.eye(30)
CALLS = {   # ufuncs (gammaln, ...) are not listed: a plain call never reaches fastad (NumPy dispatches on traced inputs only)
    'stats.norm.logpdf(x, 0.3, 2.0), 1000 points': lambda: stats.norm.logpdf(x, 0.3, 2.0),
    'stats.norm.logpdf(0.5), one point': lambda: stats.norm.logpdf(0.5),
    'stats.norm.logpdf(x, 0.3, scale=2.0)': lambda: stats.norm.logpdf(x, 0.3, scale=2.0),
    'stats.t.logpdf(small, 3.0)': lambda: stats.t.logpdf(small, 3.0),
    'multivariate_normal.logpdf, d = 30': lambda: stats.multivariate_normal.logpdf(x[:30], cov=cov),
    'special.logsumexp(x)': lambda: special.logsumexp(x),
    'special.softmax(small)': lambda: special.softmax(small),
    'linalg.solve_triangular, 30x30': lambda: linalg.solve_triangular(cov, x[:30], lower=True),
    'signal.convolve(x, small)': lambda: signal.convolve(x, small),
}

def main(rounds=200, batch=20):
    print(fd.__file__)
    modules = list(scipy_rules.RULES)
    seconds = {n: ([], []) for n in CALLS}              # (with the rules, without them)
    for f in CALLS.values(): f()                        # warm-up
    for r in range(rounds):
        for with_rules in ((True, False) if r % 2 else (False, True)):
            if with_rules:
                for m in modules: scipy_rules.register_scipy(m)
            else: scipy_rules.unregister_scipy()
            for n, f in CALLS.items():
                for _ in range(5): f()
                t = time.perf_counter()
                for _ in range(batch): f()
                seconds[n][0 if with_rules else 1].append((time.perf_counter() - t) / batch)
    for m in modules: scipy_rules.register_scipy(m)
    for n, (w, wo) in seconds.items():
        ratio = statistics.median(a / b for a, b in zip(w, wo))
        print(f"{n:45s} without {statistics.median(wo) * 1e6:8.1f} us, with {statistics.median(w) * 1e6:8.1f} us: "
              f"ratio {ratio:.3f}, {(statistics.median(w) - statistics.median(wo)) * 1e6:+.1f} us")

if __name__ == '__main__': main(*map(int, sys.argv[1:]))
