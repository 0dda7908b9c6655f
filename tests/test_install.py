"""`pip install fastad` brings only what importing fastad needs; the course's tools come with the `course` extra."""
import shutil, subprocess, sys, venv
try: import tomllib
except ModuleNotFoundError: import tomli as tomllib            # Python 3.10
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
COURSE_TOOLS = {'jupyterlab', 'nbdev', 'execnb', 'matplotlib', 'mlxtend', 'nbconvert'}

def name(requirement):
    "The distribution name of a requirement string: 'nbdev==2.4.14' -> 'nbdev'."
    for sep in '<>=!~[; ': requirement = requirement.split(sep)[0]
    return requirement.lower()

def test_core_dependencies_are_lean():
    core = {name(r) for r in PROJECT['dependencies']}
    assert core == {'numpy', 'tqdm', 'fastcore'}, f"importing fastad needs only these; move the rest to an extra: {core}"
    assert not core & COURSE_TOOLS

def test_course_extra_holds_the_course_tools_and_dev_includes_it():
    extras = PROJECT['optional-dependencies']
    assert {name(r) for r in extras['course']} >= COURSE_TOOLS
    assert 'fastad[course]' in extras['dev'], "`pip install -e '.[dev]'` must still set up the whole course"

def test_the_package_imports_only_its_core_dependencies():
    "Every module of fastad imports in a process where the course's tools cannot be imported."
    blocked = sorted(COURSE_TOOLS | {'IPython', 'sklearn', 'pandas', 'scipy'})
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None   # importing any of them now fails\n"
            "import pkgutil, importlib, fastad\n"
            "mods = [m.name for m in pkgutil.iter_modules(fastad.__path__) if m.name != '_modidx']\n"
            "for m in mods: importlib.import_module('fastad.' + m)\n"
            "print(fastad.gradient(lambda x: x * x, 3.0), len(mods))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == '6.0'

@pytest.mark.slow   # a fresh venv and pip install; test_the_package_imports_only_its_core_dependencies checks the imports
def test_pip_install_without_extras_in_a_fresh_venv(tmp_path):
    "The real thing: a new virtual environment, `pip install` of this checkout, no extras, then import and differentiate."
    src = tmp_path / 'src'                             # a copy, so the build leaves nothing in the checkout
    shutil.copytree(ROOT / 'fastad', src / 'fastad', ignore=shutil.ignore_patterns('__pycache__'))
    for f in ('pyproject.toml', 'README.md'): shutil.copy(ROOT / f, src / f)
    venv.create(tmp_path / 'venv', with_pip=True)
    py = tmp_path / 'venv' / 'bin' / 'python'
    pip = subprocess.run([py, '-m', 'pip', 'install', '-q', str(src)], capture_output=True, text=True)
    if pip.returncode and 'No matching distribution' in pip.stderr:
        pytest.skip(f"the package index is unreachable: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr
    run = subprocess.run([py, '-c', 'import fastad, fastad.testing, fastad.data; print(fastad.gradient(lambda x: x*x, 3.0))'],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == '6.0'
    listed = subprocess.run([py, '-m', 'pip', 'list', '--format=freeze'], capture_output=True, text=True).stdout
    installed = {line.split('==')[0].lower() for line in listed.splitlines()}
    assert not installed & (COURSE_TOOLS | {'scikit-learn', 'pandas', 'scipy'}), f"pulled in: {installed}"
