"""README.md is generated from nbs/index.ipynb; it must not drift, and CI runs the command it shows."""
import re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tools'))
from make_readme import readme_text

def test_readme_matches_index_notebook():
    assert (ROOT / 'README.md').read_text() == readme_text(), "README.md is out of date: run python tools/make_readme.py"

def shell_blocks(): return re.findall(r"```sh\n(.*?)\n```", (ROOT / 'README.md').read_text(), re.S)

def test_readme_opens_with_the_two_commands():
    first, second = shell_blocks()[:2]
    assert 'jupyter lab' in first and "pip install -e '.[dev]'" in first
    assert 'nbdev_test' in second and second.rstrip().endswith('pytest')   # pytest last: its summary closes the run

def test_ci_runs_the_readmes_test_command():
    out = subprocess.run(['bash', str(ROOT / '.ci' / 'run'), '--print-command'], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == shell_blocks()[1]
