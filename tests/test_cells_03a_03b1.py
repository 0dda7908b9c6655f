"Issue 18, point 8, for the primitives (03a) and NumPy-signature (03b1) notebooks: small steps, each shown and tested."
import json
from pathlib import Path
import pytest

NBS = Path(__file__).resolve().parent.parent / 'nbs'
STEMS = ['03a_primitives', '03b1_numpy_dispatch']


def _code_cells(stem):
    cells = json.loads((NBS / f'{stem}.ipynb').read_text())['cells']
    return [(c['id'], ''.join(c['source'])) for c in cells if c['cell_type'] == 'code']


@pytest.mark.parametrize('stem', STEMS)
def test_no_code_cell_over_60_lines(stem):
    long = [(i, len(s.splitlines())) for i, s in _code_cells(stem) if len(s.splitlines()) > 60]
    assert long == [], long


@pytest.mark.parametrize('stem', STEMS)
def test_each_export_cell_is_followed_by_a_shown_example_or_a_test(stem):
    "An exported definition is followed by a code cell that runs it (not by another export cell or prose alone)."
    cells = json.loads((NBS / f'{stem}.ipynb').read_text())['cells']
    bare = []
    for k, c in enumerate(cells):
        src = ''.join(c['source'])
        if c['cell_type'] != 'code' or not src.startswith('#| export'): continue
        if not any(line.startswith(('def ', 'class ', '@')) for line in src.splitlines()): continue   # imports only
        after = cells[k + 1] if k + 1 < len(cells) else None
        if after is None or after['cell_type'] != 'code' or ''.join(after['source']).startswith(('#| export', '#| hide')):
            bare.append(c['id'])
    assert bare == [], bare
