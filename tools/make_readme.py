"""Write README.md from nbs/index.ipynb: hidden cells dropped, directives stripped, outputs kept; the Speed
section gets the headline rows of the benchmark suite's latest table (bench/results.md) and its chart.

nbdev_readme needs Quarto, which not every machine can install; this does the same job with nbconvert.
Usage: python tools/make_readme.py [DEST]   (DEST defaults to README.md at the top of the repository)"""
import re, sys
from pathlib import Path
import nbformat
from nbconvert import MarkdownExporter

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r'^\s*#\s*\|.*$\n?', re.MULTILINE)

def readme_text(nb_path=ROOT / 'nbs' / 'index.ipynb'):
    "The README's markdown, made from the index notebook."
    nb = nbformat.read(nb_path, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == 'code' and re.search(r'^\s*#\s*\|\s*hide\b', cell.source, re.MULTILINE): continue
        if cell.cell_type == 'code': cell.source = DIRECTIVE.sub('', cell.source).strip()
        if cell.cell_type == 'markdown' and cell.source.startswith('# ') and not cells:   # title and summary line
            title, _, rest = cell.source.partition('\n')
            cell.source = title + '\n' + re.sub(r'^\s*>\s*', '', rest.strip())
        cells.append(cell)
    nb.cells = cells
    nb.metadata['language_info'] = {'name': 'python'}       # so code fences say python
    body, _ = MarkdownExporter(exclude_input_prompt=True, exclude_output_prompt=True).from_notebook_node(nb)
    note = "<!-- Generated from nbs/index.ipynb by tools/make_readme.py: edit the notebook, not this file. -->\n\n"
    body = with_benchmarks(re.sub(r'\n{3,}', '\n\n', body).strip())
    return note + body + '\n'

def bench_summary(results=ROOT / 'bench' / 'results.md'):
    "The headline rows of the suite's latest table (not the variants, nor every memory method) and its chart."
    if not results.exists(): return None
    text = results.read_text()
    date = re.search(r'on (\d{4}-\d{2}-\d{2})', text)
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('| workload'))
    table = lines[start:start + 2]
    for line in lines[start + 2:]:
        if not line.startswith('|'): break
        if '[fastad' in line.split('|')[1] or 'tracemalloc' in line or 'held after' in line: continue
        table.append(line)
    notes = [l.strip() for l in lines if l.startswith('<sup>')]
    machine = next((l for l in lines if l.startswith('Machine:')), '')
    return '\n'.join([f"The suite's latest run ({date.group(1) if date else 'undated'}; figures are medians, *(r×)* is "
                      f"fastad / that library, above 1 slower; {machine[len('Machine: '):].rstrip('.')}), from "
                      f"`bench/results.md`:", '', *table, '', *notes, '', '![fastad against its peers](bench/results.png)'])

def with_benchmarks(body):
    "The body with the benchmark summary at the end of its Speed section."
    summary = bench_summary()
    if summary is None or '## Speed' not in body: return body
    head, _, rest = body.partition('## Speed')
    section, sep, tail = rest.partition('\n## ')
    return head + '## Speed' + section.rstrip() + '\n\n' + summary + '\n' + (('\n## ' + tail) if sep else '')

if __name__ == '__main__':
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / 'README.md'
    dest.write_text(readme_text())
    print(f"wrote {dest}")
