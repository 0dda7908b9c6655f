"""How much Python one step of fastad runs, counted exactly: `python -m bench.opcodes cnn [--top 25]`.

Timings of a step drift with the machine's load by a few per cent, which is as much as a change to the engine moves
them. The number of Python bytecode instructions one step executes does not drift: it is counted here with
`sys.settrace` (opcode events), per function, for fastad's contender of a workload. Compare two trees by running
this in each (`cd TREE && python -m bench.opcodes cnn`); NumPy's own C work is not counted, only the Python around it."""
import argparse, sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

def count(step):
    "{(file, function): instructions} executed by one call of `step`."
    counts = Counter()
    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == 'opcode': counts[Path(frame.f_code.co_filename).name, frame.f_code.co_name] += 1
        return tracer
    sys.settrace(tracer)
    try: step()
    finally: sys.settrace(None)
    return counts

def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m bench.opcodes', description=__doc__.splitlines()[0])
    p.add_argument('workload', choices=('mlp', 'cnn', 'scalar'))
    p.add_argument('--case', default=None, help="the workload's case (default: its first)")
    p.add_argument('--top', type=int, default=25, help='functions to list (default: 25)')
    args = p.parse_args(argv)
    module = __import__(f'bench.workloads.{args.workload}', fromlist=['_'])
    contender = module.CONTENDERS['fastad'](module.sizes(True))
    step = contender.cases[args.case or next(iter(contender.cases))]
    for _ in range(3): step()                         # warmed up: caches filled, rules registered
    counts = count(step)
    print(f"{sum(counts.values()):,} Python instructions in one {args.workload} step of fastad")
    for (file, name), n in counts.most_common(args.top): print(f"{n:8,}  {file}:{name}")

if __name__ == '__main__':
    main()
