"""Where fastad's time goes on workloads 1-3: `python -m bench.profile [--only mlp,scalar,cnn] [--seconds 3] [--html DIR]`.

Runs fastad's contender of each workload under pyinstrument (in the dev extra) for about `--seconds`, then prints
the frames that take the most time by their own code (self time) and pyinstrument's call tree, trimmed."""
import argparse, os, sys, time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = {'mlp': [('fastad', 'step')], 'scalar': [('fastad', 'mixed'), ('fastad', 'constant'), ('fastad', 'traced'),
                                                 ('fastad', 'tape 30,000')],
         'cnn': [('fastad', 'step'), ('fastad, traced NumPy', 'step'), ('fastad, traced einsum', 'step')]}

def self_times(frame, totals):
    "Sum each function's own time (its time less its callees') over the call tree."
    real = [c for c in frame.children if not c.is_synthetic]
    totals[frame.function, frame.file_path_short, frame.line_no] += frame.time - sum(c.time for c in real)
    for child in real: self_times(child, totals)

def profile(workload, name, case, seconds, interval, html):
    from pyinstrument import Profiler
    from bench.workloads.common import Skip
    module = __import__(f'bench.workloads.{workload}', fromlist=['_'])
    size = module.sizes(False)
    if workload == 'scalar': size = dict(size, lengths=(1_000, 30_000))
    try: contender = module.CONTENDERS[name](size)
    except Skip as e:
        print(f"\n== {workload} / {name}: skipped: {e}"); return
    f = contender.cases[case]
    f()                                                   # warm-up, outside the profile
    profiler = Profiler(interval=interval)
    calls, start = 0, time.perf_counter()
    profiler.start()
    while time.perf_counter() - start < seconds: f(); calls += 1
    profiler.stop()
    root = profiler.last_session.root_frame()
    totals = Counter()
    self_times(root, totals)
    total = root.time
    print(f"\n== {workload} / {name} / {case}: {calls} calls, {total / calls * 1e3:.3f} ms a call under the profiler")
    print(f"   top frames by self time (% of the total):")
    for (fn, path, line), t in totals.most_common(14):
        print(f"   {100 * t / total:5.1f}%  {fn}  ({path}:{line})")
    print(profiler.output_text(unicode=True, color=False, show_all=False, short_mode=False)[:6000])
    if html:
        out = Path(html) / f"{workload}-{name.replace(', ', '-').replace(' ', '-')}-{case.replace(' ', '').replace(',', '')}.html"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(profiler.output_html())
        print(f"   wrote {out}")

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench.profile', description=__doc__.splitlines()[0])
    p.add_argument('--only', default='mlp,scalar,cnn')
    p.add_argument('--seconds', type=float, default=3.0, help='profile each case for about this long')
    p.add_argument('--interval', type=float, default=0.0002, help="pyinstrument's sampling interval, seconds")
    p.add_argument('--html', default=None, help='also write an HTML profile per case into this folder')
    args = p.parse_args(argv)
    os.environ.setdefault('FASTAD_BENCH_THREADS', '1')
    for workload in args.only.split(','):
        for name, case in CASES[workload]:
            profile(workload, name, case, args.seconds, args.interval, args.html)

if __name__ == '__main__':
    main()
