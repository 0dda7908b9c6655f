"""The suite's figures as printed lines, a Markdown table (results.md) and a chart (results.png), all from one run's results."""
import datetime
import numpy as np

COLUMNS = {'fastad': 'fastad', 'numpy': 'hand-written', 'torch': 'PyTorch eager', 'jax': 'JAX jit',
           'autograd': 'HIPS autograd', 'floor': 'floor'}
PEERS = ('numpy', 'torch', 'jax', 'autograd', 'floor')
CASE_LABELS = {'mixed': 'mixed chain (sin, ×0.5, +0.1, exp)', 'constant': 'ops with a constant (×0.999, +0.001)',
               'traced': 'ops on two traced operands (x·x, +y)', 'none': 'no checkpoints', 'sqrt': '√n segments',
               'every': 'every layer a segment'}

def fmt(v):
    if v is None: return '—'
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3g}"

def fmt_ratio(r): return f"{r:,.0f}×" if r >= 100 else f"{r:.2f}×"

def _ops(module, size, case):
    "Operations in a case (per-op units), else 1."
    return module.cases(size)[case] if callable(getattr(module, 'cases', None)) else 1

def _scale(wl, case):
    "(seconds -> unit factor, unit) of a workload's timed cases."
    if wl['workload'] == 'checkpointing': return 1e3, 'ms'
    import importlib
    module = importlib.import_module(f"bench.workloads.{wl['workload']}")
    return module.SCALE / _ops(module, wl['size'], case), module.UNIT

def _paired(a, b):
    n = min(len(a), len(b))
    return float(np.median(np.array(a[:n]) / np.array(b[:n]))) if n else None

def print_entry(wl, e, out):
    "One contender's raw figures: medians, minima, its GEMM probe, its check."
    if e['status'] != 'ok':
        if e['status'] == 'failed': out(f"  {e['name']:24s} failed: {e['reason']}")
        return
    head = f"  {e['name']:24s} {e['version']:>14s}  GEMM probe {fmt(e['gflops'])} GFLOP/s" if e['gflops'] else \
           f"  {e['name']:24s} {e['version']:>14s}"
    out(head + (f"  ({e['note']})" if e['note'] else ''))
    for case, calls in e['calls'].items():
        factor, unit = _scale(wl, case)
        out(f"      {case:14s} median {fmt(np.median(calls) * factor):>8s} {unit}   min {fmt(min(calls) * factor):>8s} {unit}"
            f"   ({len(calls)} calls, {len(e['rounds'][case])} rounds)   check: {e['check'].get(case, '?')}")
    for case, m in e['memory'].items():
        figures = '   '.join(f"{k} {fmt(v / 2**20)} MiB" for k, v in m.items())
        out(f"      {case:14s} {figures}   check: {e['check'].get(case, '?')}")

def rows(name, wl):
    "The table's rows for one workload: (label, {column: (figure, unit, ratio fastad/peer or None) or a skip reason})."
    entries, out = wl['entries'], []
    fastads = [n for n in entries if n.split(',')[0] == 'fastad']
    peers = [p for p in PEERS if p in entries]
    if name in ('memory', 'checkpointing'):
        cases = list(dict.fromkeys(c for e in entries.values() for c in e['memory'])) or ['step']
        for case in cases:
            for method, label in (('rss peak', 'peak (RSS)'), ('rss held', 'held after forward (RSS)'),
                                  ('tracemalloc peak', 'peak (tracemalloc, NumPy arrays only)')):
                have = [e for e in entries.values() if method in e['memory'].get(case, {})]
                if not have: continue
                cells = {}
                for n in ['fastad'] + peers:
                    e = entries.get(n)
                    if e is None: continue
                    if e['status'] != 'ok': cells[n] = e['reason']; continue
                    v = e['memory'].get(case, {}).get(method)
                    if v is None: continue
                    f = entries.get('fastad', {}).get('memory', {}).get(case, {}).get(method)
                    cells[n] = (v / 2**20, 'MiB', None if n == 'fastad' or f is None or v <= 0 else f / v)
                prefix = f"{CASE_LABELS.get(case, case)}: " if name == 'checkpointing' else ''
                out.append((f"{wl['title']}: {prefix}{label}" if prefix else f"{wl['title']}, {label}", cells))
            if name == 'checkpointing':
                cells = {}
                for n in ['fastad'] + peers:
                    e = entries.get(n)
                    if e is None: continue
                    if e['status'] != 'ok': cells[n] = e['reason']; continue
                    if case not in e['rounds']: continue
                    f = entries['fastad']['rounds'].get(case) if entries.get('fastad', {}).get('status') == 'ok' else None
                    cells[n] = (np.median(e['calls'][case]) * 1e3, 'ms',
                                None if n == 'fastad' or not f else _paired(f, e['rounds'][case]))
                out.append((f"{wl['title']}: {CASE_LABELS.get(case, case)}: step time", cells))
        return out
    cases = list(dict.fromkeys(c for e in entries.values() for c in e['rounds'])) or ['step']
    for variant in fastads:
        fe = entries[variant]
        for case in cases:
            if fe['status'] == 'ok' and case not in fe['rounds']: continue
            if variant != 'fastad' and fe['status'] != 'ok': continue
            factor, unit = _scale(wl, case)
            cells = {'fastad': fe['reason'] if fe['status'] != 'ok' else (np.median(fe['calls'][case]) * factor, unit, None)}
            for p in peers:
                e = entries[p]
                if e['status'] != 'ok': cells[p] = e['reason']; continue
                if case not in e['rounds']: continue
                ratio = _paired(fe['rounds'][case], e['rounds'][case]) if fe['status'] == 'ok' else None
                cells[p] = (np.median(e['calls'][case]) * factor, unit, ratio)
            label = wl['title'] + ('' if case == 'step' else f": {CASE_LABELS.get(case, case)}")
            out.append((label + ('' if variant == 'fastad' else f" [{variant}]"), cells))
    return out

def checkpoint_relative(wl):
    "Each library's checkpointed step against its own step with no checkpoints: (library, case, held, peak, time)."
    out = []
    for n, e in wl['entries'].items():
        m = e['memory']
        if e['status'] != 'ok' or 'none' not in m: continue
        for case in ('sqrt', 'every'):
            if case not in m: continue
            r = lambda k: m[case][k] / m['none'][k] if m['none'].get(k) and k in m[case] else None
            t = (np.median(e['calls'][case]) / np.median(e['calls']['none'])) if e['calls'].get(case) else None
            out.append((n, case, r('rss held'), r('rss peak'), t))
    return out

def print_ratios(name, wl, out):
    if name == 'checkpointing':
        out("  checkpointed / no checkpoints, per library (held, peak, time):")
        for n, case, held, peak, t in checkpoint_relative(wl):
            out(f"      {COLUMNS.get(n, n):14s} {CASE_LABELS[case]:22s} held {fmt(held)}×   peak {fmt(peak)}×   time {fmt(t)}×")
    for label, cells in rows(name, wl):
        out(f"  {label}")
        for n, cell in cells.items():
            if isinstance(cell, str): out(f"      {COLUMNS[n]:14s} skipped: {cell}"); continue
            v, unit, ratio = cell
            out(f"      {COLUMNS[n]:14s} {fmt(v):>8s} {unit}" + (f"   fastad / {COLUMNS[n]} = {fmt_ratio(ratio)}" if ratio else ''))

def write_markdown(results, path):
    notes, lines = [], []
    def note(reason):
        if reason not in notes: notes.append(reason)
        return f"skipped<sup>{notes.index(reason) + 1}</sup>"
    cols = list(COLUMNS)
    lines.append('| workload | ' + ' | '.join(COLUMNS[c] for c in cols) + ' |')
    lines.append('|---|' + '---|' * len(cols))
    for name, wl in results['workloads'].items():
        for label, cells in rows(name, wl):
            row = []
            for c in cols:
                cell = cells.get(c)
                if cell is None: row.append('—')
                elif isinstance(cell, str): row.append(note(cell))
                else:
                    v, unit, ratio = cell
                    row.append(f"{fmt(v)} {unit}" if c == 'fastad' or ratio is None else f"{fmt(v)} ({fmt_ratio(ratio)})")
            lines.append(f"| {label} | " + ' | '.join(row) + ' |')
    m = results['machine']
    head = [
        '# fastad benchmark results', '',
        f"Generated by `python -m bench{' --quick' if results['quick'] else ''}` on "
        f"{datetime.date.today().isoformat()} in {results['seconds']:.0f} s; do not edit by hand. "
        "Each library ran in a fresh process of its own, all with the same thread count; rounds were interleaved. "
        "Figures are medians; *(r×)* after a peer's figure is fastad / that peer, the median of the ratios within a "
        "round (above 1: fastad is slower or uses more memory). The floor is the least work there is: the GEMMs alone "
        "(MLP), the chain with no derivative (scalars). For scalar chains, *hand-written* is a minimal pure-Python tape.", '',
        f"Machine: {m['cpu']}, {m['cores']} cores ({m['cores available']} available), {m['threads']} thread(s) "
        f"per library; Python {m['python']}, NumPy {m['numpy']}, BLAS {m['blas']}.", '']
    tail = ['']
    for i, n in enumerate(notes): tail.append(f"<sup>{i + 1}</sup> {n}  ")
    tail += gpu_section(path.parent / 'results_gpu.md')
    if 'checkpointing' in results['workloads']:
        tail += ['', '## Checkpointing against no checkpoints, per library', '',
                 '| library | plan | held | peak | step time |', '|---|---|---|---|---|']
        for n, case, held, peak, t in checkpoint_relative(results['workloads']['checkpointing']):
            tail.append(f"| {COLUMNS.get(n, n)} | {CASE_LABELS[case]} | {fmt(held)}× | {fmt(peak)}× | {fmt(t)}× |")
    tail += ['', '## Per process', '', '| workload | contender | version | GEMM probe (GFLOP/s) | thread pools | first-call check |',
             '|---|---|---|---|---|---|']
    for name, wl in results['workloads'].items():
        for n, e in wl['entries'].items():
            if e['status'] != 'ok': continue
            checks = '; '.join(f"{c}: {v}" for c, v in e['check'].items())
            tail.append(f"| {name} | {n} | {e['version']} | {fmt(e['gflops'])} | {', '.join(e['pools']) or '—'} | {checks} |")
    path.write_text('\n'.join(head + lines + tail) + '\n')

GPU_HEADING = '## On a GPU'

def gpu_section(gpu_results):
    "The lines of results.md's GPU section: the table `python -m bench.gpu` wrote, or why there is none."
    body = (gpu_results.read_text().strip() if gpu_results.exists() else
            "Not measured: `python -m bench.gpu` has not run on a machine with a GPU.")
    return ['', GPU_HEADING, '', body]

def refresh_gpu_section(results_md, gpu_results):
    "Put the GPU table into an existing results.md, in place of its GPU section, leaving the CPU figures as they are."
    if not results_md.exists(): return
    lines = results_md.read_text().rstrip('\n').split('\n')
    if GPU_HEADING in lines:                          # from the heading up to the next section, or the end
        start = lines.index(GPU_HEADING)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith('## ')), len(lines))
    else:                                             # a new section, before the first one there is
        start = end = next((i for i, l in enumerate(lines) if l.startswith('## ')), len(lines))
    before, after = lines[:start], lines[end:]
    while before and before[-1] == '': before.pop()   # one blank line on each side, however many there were
    results_md.write_text('\n'.join(before + gpu_section(gpu_results) + ([''] + after if after else [])) + '\n')

def write_chart(results, path):
    "Horizontal bars: fastad / peer for every row and peer, on a log axis with 1 marked."
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    bars = []
    for name, wl in results['workloads'].items():
        for label, cells in rows(name, wl):
            ratios = {c: cell[2] for c, cell in cells.items() if not isinstance(cell, str) and cell[2]}
            if ratios: bars.append((label, ratios))
    peers = [p for p in PEERS if p != 'floor' and any(p in r for _, r in bars)]   # the floor stays in the table
    bars = [(label, r) for label, r in bars if any(p in r for p in peers)]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.42 * max(len(bars), 1)))
    height = 0.8 / max(len(peers), 1)
    for j, p in enumerate(peers):
        ys = [i + (j - (len(peers) - 1) / 2) * height for i, (_, r) in enumerate(bars) if p in r]
        xs = [r[p] for _, r in bars if p in r]
        ax.barh(ys, xs, height=height, label=COLUMNS[p], left=0)
    ax.axvline(1, color='black', lw=1)
    ax.set_xscale('log')
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([_wrap(label) for label, _ in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel('fastad / peer (log scale; below 1: fastad is faster or uses less memory)')
    ax.set_title(f"fastad against its peers ({results['machine']['cpu']}, {results['machine']['threads']} thread(s))",
                 fontsize=10)
    if peers: ax.legend(fontsize=8, loc='lower right')
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches='tight')     # long workload names on the left stay whole
    plt.close(fig)

def _wrap(label, width=44):
    words, lines, line = label.split(), [], ''
    for w in words:
        if len(line) + len(w) + 1 > width: lines.append(line); line = w
        else: line = f"{line} {w}".strip()
    return '\n'.join(lines + [line])

if __name__ == '__main__':            # python -m bench.report RESULTS.json [FOLDER]: the table and chart again
    import json, sys
    from pathlib import Path
    results = json.loads(Path(sys.argv[1]).read_text())
    folder = Path(sys.argv[2] if len(sys.argv) > 2 else Path(__file__).parent)
    write_markdown(results, folder / 'results.md')
    write_chart(results, folder / 'results.png')
