"""Write README.md from nbs/index.ipynb: hidden cells dropped, directives stripped, outputs kept.

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
    return note + re.sub(r'\n{3,}', '\n\n', body).strip() + '\n'

if __name__ == '__main__':
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / 'README.md'
    dest.write_text(readme_text())
    print(f"wrote {dest}")
