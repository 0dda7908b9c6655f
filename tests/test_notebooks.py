"""The notebooks: their shape (small code cells; each exported definition followed by a cell that shows and tests
it), and every lesson on the other backends: on the strict backend, which refuses silent host copies as CuPy does
(so a lesson that would break on a GPU breaks here), and on a GPU, GPU-only cells included, where CuPy can run."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from fastad.backend import gpu_available

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / 'nbs'
NOTEBOOKS = sorted(p.stem for p in NBS.glob('*.ipynb'))

def cells(stem): return json.loads((NBS / f'{stem}.ipynb').read_text())['cells']
def source(cell): return ''.join(cell['source'])

def exports(stem):
    "Does the notebook export code (a `#| default_exp` line, or an `#| export` cell)?"
    return any(line.startswith(('#| default_exp', '#| export')) for c in cells(stem) if c['cell_type'] == 'code'
               for line in source(c).splitlines())

# Every exporting notebook shows and tests each exported definition: the cell after it runs it.
EXPORTING = [s for s in NOTEBOOKS if exports(s)]

@pytest.mark.parametrize('stem', NOTEBOOKS)
def test_no_code_cell_over_60_lines(stem):
    long = [(c['id'], len(source(c).splitlines())) for c in cells(stem)
            if c['cell_type'] == 'code' and len(source(c).splitlines()) > 60]
    assert long == [], long

def bare_exports(stem):
    """The ids of the exported cells that define something (def, class, a decorator) and are not followed by a code
    cell that runs it: followed instead by another export cell, a hidden cell or prose alone. Counted from the
    heading "## The library's version" where there is one."""
    cs = cells(stem)
    start = next((i for i, c in enumerate(cs) if c['cell_type'] == 'markdown'
                  and source(c).startswith("## The library's version")), 0)
    bare = []
    for k in range(start, len(cs)):
        c, src = cs[k], source(cs[k])
        if c['cell_type'] != 'code' or not src.startswith('#| export'): continue
        if not any(line.startswith(('def ', 'class ', '@')) for line in src.splitlines()): continue   # imports only
        after = cs[k + 1] if k + 1 < len(cs) else None
        if after is None or after['cell_type'] != 'code' or source(after).startswith(('#| export', '#| hide')):
            bare.append(c['id'])
    return bare

@pytest.mark.parametrize('stem', EXPORTING)
def test_each_exported_definition_is_followed_by_a_cell_that_shows_and_tests_it(stem):
    assert bare_exports(stem) == [], bare_exports(stem)

def run_lessons(backend, *flags):
    "Run every notebook with nbdev_test, the lessons' toggle cells picking `backend`; return the finished process."
    env = {**os.environ, 'FASTAD_BACKEND': backend, 'MPLBACKEND': 'Agg'}
    nbdev_test = Path(sys.executable).parent / 'nbdev_test'
    return subprocess.run([str(nbdev_test), *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)

@pytest.mark.slow   # every notebook again (the README's command has just run them all on NumPy)
def test_every_lesson_runs_on_the_strict_backend():
    done = run_lessons('strict')
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

@pytest.mark.skipif(not gpu_available(), reason="needs a GPU that CuPy can use")
def test_every_lesson_runs_on_the_gpu_with_its_gpu_cells():
    done = run_lessons('cupy', '--flags', 'gpu')
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


# --- prose that quotes a timing is printed from it ---------------------------------------------------------------
def test_lesson_03s_speed_verdict_is_printed_from_the_measured_ratios():
    "Whether the manual version less the skipped product comes out close to the engine is decided by the ratios."
    cs = cells('03_vwc_chainers')
    assert not any('comes out close to' in source(c) for c in cs if c['cell_type'] == 'markdown'), "prose can't know"
    timing = next(source(c) for c in cs if c['cell_type'] == 'code' and 'skipped_t = timed(' in source(c))
    assert 'verdict = "comes out close to the engine\'s time"' in timing and 'the product the engine never runs {verdict}' in timing
    decide = 'ratio, without = R, W\n' + timing.split('ratio, without = ', 1)[1].split('\n', 1)[1].split('print(', 1)[0]
    def verdict(r, w): ns = {'R': r, 'W': w}; exec(decide, ns); return ns['verdict']
    assert verdict(0.93, 0.95).startswith('comes out close') and verdict(0.61, 0.95).startswith('is still slower')
    assert verdict(1.3, 0.95).startswith('beats the engine')

def test_the_glossary_names_each_word_once_and_closes_the_appendix():
    "The glossary page (an appendix chapter) defines each of the words the code uses in one sense."
    text = ' '.join(source(c) for c in cells('91_glossary') if c['cell_type'] == 'markdown')
    for word in ('**recording**', '**tape entry**', '**rule**', '**row**', '**VWC**', '**VJP**', '**pullback**',
                 '**forward pass**', '**forward function**', '**forward mode**', '**recompute**', '**checkpoint**',
                 '**segment**', '**discard**', '**replay**', '**adapter**', '**group**', '**domain**'):
        assert text.count(word) == 1, word
    sidebar = (NBS / 'sidebar.yml').read_text()
    assert '91_glossary.ipynb' in sidebar.split('Appendix')[1]

LEAK_CHECK = '''
import inspect, sys
from pathlib import Path
import fastad
from nbdev.test import test_nb
def snapshot():
    "Every fastad module's names, and the attributes of the classes it defines, as objects."
    seen = {}
    for name, m in sorted(sys.modules.items()):
        if not name.startswith('fastad.') or m is None: continue
        for k, v in list(vars(m).items()):
            seen[(name, k)] = v
            if inspect.isclass(v) and v.__module__ == name:
                for a, w in list(vars(v).items()): seen[(name, k, a)] = w
    return seen
for nb in sys.argv[1:]:
    before = snapshot()
    ok, _ = test_nb(Path(nb), basepath=Path.cwd().parent)
    after = snapshot()
    changed = [k for k, v in before.items() if after.get(k) is not v and not (type(v) in (int, float, str, bool) and after.get(k) == v)]
    print(Path(nb).stem, ok, changed[:5])
'''

@pytest.mark.slow   # runs every exporting notebook once more, one after another in one process
def test_no_notebook_leaves_the_library_changed_for_the_next_one(tmp_path):
    """nbdev_test runs several notebooks in one worker process: a notebook whose exported cells attach methods to a
    library class (Traced) or hand a lower module a class must put the module's own back, or the next notebook in that
    process runs the notebook's copies."""
    script = tmp_path / 'leak_check.py'
    script.write_text(LEAK_CHECK)
    out = subprocess.run([sys.executable, str(script), *[str(NBS / f'{s}.ipynb') for s in EXPORTING]], cwd=NBS,
                         env={**os.environ, 'MPLBACKEND': 'Agg'}, capture_output=True, text=True, timeout=900).stdout
    rows = [line.split(' ', 2) for line in out.splitlines() if line.split(' ', 1)[0] in EXPORTING]
    assert len(rows) == len(EXPORTING), out[-2000:]
    assert [r for r in rows if r[1] != 'True' or r[2] != '[]'] == [], out[-2000:]
