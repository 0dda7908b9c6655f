"""Lessons 04 and 05 in small steps (issue 18, point 8): no code cell over 60 lines, as `test_tidy2` checks for
the reference notebooks."""
import json, pathlib
import pytest

NBS = pathlib.Path(__file__).parent.parent / 'nbs'


@pytest.mark.parametrize('stem', ['04_custom_derivatives', '05_checkpointing'])
def test_no_code_cell_over_60_lines(stem):
    cells = json.loads((NBS / f'{stem}.ipynb').read_text())['cells']
    long = [(c['id'], len(''.join(c['source']).splitlines())) for c in cells
            if c['cell_type'] == 'code' and len(''.join(c['source']).splitlines()) > 60]
    assert long == [], long


@pytest.mark.parametrize('stem', ['04_custom_derivatives', '05_checkpointing'])
def test_each_split_definition_is_shown_and_tested(stem):
    "In the library sections, an exported cell that defines something is followed by a code cell, not by another export."
    cells = json.loads((NBS / f'{stem}.ipynb').read_text())['cells']
    start = next(i for i, c in enumerate(cells) if c['cell_type'] == 'markdown'
                 and ''.join(c['source']).startswith("## The library's version"))
    lonely = []
    for c, after in zip(cells[start:], cells[start + 1:]):
        src = ''.join(c['source'])
        if c['cell_type'] != 'code' or not src.startswith('#| export'): continue
        if not any(line.startswith(('def ', 'class ', '@patch')) for line in src.splitlines()): continue   # imports only
        if after['cell_type'] != 'code' or ''.join(after['source']).startswith('#| export'): lonely.append(c['id'])
    assert lonely == [], lonely
