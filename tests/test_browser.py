"""The course as a learner sees it, in a real browser (Debian's Chromium, headless, driven by selenium):
the offline site page by page, and lesson 01 run top to bottom in JupyterLab.

Needs `apt-get install -y chromium chromium-driver`; without them these tests skip and say so."""
import json, os, re, shutil, signal, socket, subprocess, sys, time, urllib.request, uuid
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'tools'))
import build_docs
from test_docs import build_site, cells, sidebar_stems

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
CHROMEDRIVER = shutil.which('chromedriver')
WIDTH, HEIGHT = 1280, 1000
try: import selenium
except ImportError: selenium = None
# The whole file is slow: it builds the site and drives a browser (about 30 s before its first test). CI's slow
# phase runs it; `pytest -m slow tests/test_browser.py` here.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER and selenium), reason=(
    "no browser to test with: install Chromium and its driver (apt-get install -y chromium chromium-driver) "
    "and selenium (pip install -e '.[dev]')"))]

@pytest.fixture(scope='module')
def browser():
    "Headless Chromium that keeps the page's console messages."
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--hide-scrollbars',
                f'--window-size={WIDTH},{HEIGHT}', '--force-device-scale-factor=1'):
        opts.add_argument(arg)
    opts.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))   # given paths: nothing is downloaded
    driver.set_page_load_timeout(60)
    try: yield driver
    finally: driver.quit()

def console_errors(driver):
    return [e['message'] for e in driver.get_log('browser') if e['level'] == 'SEVERE']

# --- (a) the offline site ---------------------------------------------------------------------------------
@pytest.fixture(scope='session')
def site(tmp_path_factory): return build_site(tmp_path_factory)

def known_output(stem):
    "A line of the first saved text output of a shown cell: what the page must show."
    for c in cells(stem):
        if c['cell_type'] != 'code' or re.search(r'^\s*#\s*\|\s*(hide|export)', ''.join(c['source']), re.M): continue
        for o in c.get('outputs', []):
            txt = ''.join(o.get('text', '') or o.get('data', {}).get('text/plain', ''))
            line = next((l.strip() for l in txt.splitlines() if len(l.strip()) > 3), None)
            if line and o.get('output_type') != 'error': return line
    return None

def test_every_page_opens_with_its_title_and_outputs_and_no_errors(browser, site):
    from selenium.webdriver.common.by import By
    pages = [build_docs.page_name(s) for s in sidebar_stems()] + ['api', 'numpy', 'benchmarks']
    broken, errors, ids = [], {}, {}
    for name in pages:
        browser.get((site / f'{name}.html').as_uri())
        h1 = browser.find_element(By.TAG_NAME, 'h1').text
        title = browser.title.split(' · ')[0]
        assert title and h1.startswith(title), f"{name}: title {browser.title!r}, heading {h1!r}"
        stem = next((s for s in sidebar_stems() if build_docs.page_name(s) == name), None)
        if stem and known_output(stem):
            assert known_output(stem) in browser.find_element(By.TAG_NAME, 'main').text, f"{name}: an output is missing"
        if errors_here := console_errors(browser): errors[name] = errors_here
        links = browser.execute_script(
            "return [...document.querySelectorAll('a[href]')].map(a => [a.href, a.hash])")
        for href, frag in links:
            if not href.startswith('file://'): continue
            target = Path(urllib.request.url2pathname(href.split('#')[0][len('file://'):]))
            if target not in ids: ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text())) if target.exists() else None
            if ids[target] is None or (frag and frag[1:] not in ids[target]):
                broken.append(f'{name} -> {href}')
    assert not errors, f"console errors: {errors}"
    assert not broken, f"broken links: {broken}"

def test_a_lesson_looks_like_a_page(browser, site):
    "A screenshot of lesson 01: the size asked for, not blank, the sidebar and a code panel in their colours."
    from PIL import Image
    browser.get((site / 'matmul.html').as_uri())
    shot = site / 'screenshot-matmul.png'
    assert browser.save_screenshot(str(shot))
    img = Image.open(shot).convert('RGB')
    viewport = tuple(browser.execute_script("return [window.innerWidth, window.innerHeight]"))
    assert img.size == viewport and img.size[0] == WIDTH and img.size[1] > HEIGHT * 0.7, (img.size, viewport)
    W, H = img.size
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) > 200, "a blank or flat page"
    ink = sum(n for n, c in colours if sum(c) < 3 * 200)
    assert ink > 0.01 * W * H, "hardly any text on the page"
    assert img.getpixel((20, H - 20)) == (0xfa, 0xfb, 0xfc), "the sidebar's background, down the left"
    width = browser.execute_script("return document.querySelector('article').getBoundingClientRect().width")
    assert 600 < width <= 52 * 17 + 1, f"a readable column, not the whole screen: {width}px"

def test_a_solution_is_folded_until_opened(browser, site):
    "Lesson 04's exercises: each solution's code hidden under a 'Solution' line, shown by a click."
    from selenium.webdriver.common.by import By
    browser.get((site / f"{build_docs.page_name('04_custom_derivatives')}.html").as_uri())
    folds = browser.find_elements(By.CSS_SELECTOR, 'details.fold')
    assert folds and all(f.find_element(By.TAG_NAME, 'summary').text == 'Solution' for f in folds)
    code = folds[0].find_element(By.CSS_SELECTOR, '.input_area')
    assert not code.is_displayed(), "folded at first"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", folds[0])
    folds[0].find_element(By.TAG_NAME, 'summary').click()
    assert code.is_displayed() and 'softplus' in code.text, "a click shows the solution"

def test_checks_are_folded_until_opened(browser, site):
    "Lesson 01: each cell that only checks sits folded under 'checks' where it stands; a click shows its code."
    from selenium.webdriver.common.by import By
    browser.get((site / f"{build_docs.page_name('01_matmul')}.html").as_uri())
    guards = browser.find_elements(By.CSS_SELECTOR, 'article details.guard')
    assert len(guards) >= 5 and all(g.find_element(By.TAG_NAME, 'summary').text == 'checks' for g in guards)
    assert not any(g.get_attribute('open') for g in guards), "folded at first"
    code = guards[0].find_element(By.CSS_SELECTOR, '.input_area')
    assert not code.is_displayed()
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", guards[0])
    guards[0].find_element(By.TAG_NAME, 'summary').click()
    assert code.is_displayed() and re.search(r'\b(test_\w+|check_\w+|assert)\b', code.text), "a click shows the checks"
    summary_h = guards[1].find_element(By.TAG_NAME, 'summary').size['height']
    assert summary_h < 30, f"a folded check takes one short line, not a code panel: {summary_h}px"

REACHABLE = """const pre = arguments[0];
    const ends = [], walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) { const node = walker.currentNode, t = node.textContent.trimEnd();
      if (t.trim()) { const r = document.createRange(); r.setStart(node, t.length - 1); r.setEnd(node, t.length); ends.push(r); } }
    const widest = ends.reduce((a, b) => b.getBoundingClientRect().right > a.getBoundingClientRect().right ? b : a);
    pre.scrollLeft = pre.scrollWidth;
    const r = widest.getBoundingClientRect(), box = pre.getBoundingClientRect();
    return [pre.scrollWidth, pre.clientWidth, getComputedStyle(pre).overflowX, r.right <= box.right + 1 && r.left >= box.left, pre.scrollLeft]"""

@pytest.mark.parametrize('page, marker', [('index', 'jupyter lab --allow-root nbs/'),
                                          ('vwc_chainers', 'forward_and_backward as forward_and_backward')])
def test_a_long_line_scrolls_and_its_end_can_be_reached(browser, site, page, marker):
    "The install command (index) and lesson 03's long import: the block scrolls sideways, and scrolled, its end is in view."
    from selenium.webdriver.common.by import By
    browser.get((site / f'{page}.html').as_uri())
    pres = [p for p in browser.find_elements(By.CSS_SELECTOR, 'article pre') if marker in p.get_attribute('textContent')]
    assert pres, f"{page}: no code block with {marker!r}"
    scroll_w, client_w, overflow, end_in_view, left = browser.execute_script(REACHABLE, pres[0])
    assert scroll_w > client_w and overflow == 'auto', f"{page}: the long line should scroll ({scroll_w} > {client_w}, {overflow})"
    assert left > 0 and end_in_view, f"{page}: scrolled to the end, the longest line's last character is in view"
    width = browser.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"{page}: the page itself does not scroll sideways: {width}"

def test_the_course_tables_links_open_their_pages(browser, site):
    "The index's course tables (the lessons, then the reference): each notebook's name is a link that opens its page."
    from selenium.webdriver.common.by import By
    browser.get((site / 'index.html').as_uri())
    tables = browser.find_elements(By.CSS_SELECTOR, 'article table')[:2]
    links = [(a.text, a.get_attribute('href')) for t in tables for a in t.find_elements(By.CSS_SELECTOR, 'a')]
    names = [c.text for t in tables for c in t.find_elements(By.CSS_SELECTOR, 'td code')]
    assert sorted(n for n, _ in links) == sorted(p.stem for p in (ROOT / 'nbs').glob('[0-9]*.ipynb'))
    assert [n for n, _ in links] == [n for n in names if re.match(r'\d', n)]
    for name, href in links:
        browser.get(href)
        h1 = browser.find_element(By.TAG_NAME, 'h1').text
        stem_page = build_docs.page_name(name)
        assert href.endswith(f'/{stem_page}.html') and h1 and browser.title.startswith(h1.rstrip('#').strip()), (name, href, h1)

def test_every_lesson_title_carries_its_number(browser, site):
    "Lessons 1 to 9: 'Lesson N: ...' as the tab's title, the page's heading and the sidebar's entry."
    from selenium.webdriver.common.by import By
    lessons = [(s, build_docs.lesson_number(s)) for s in sidebar_stems() if build_docs.lesson_number(s) is not None]
    assert [n for _, n in lessons] == list(range(1, 13))
    for stem, n in lessons:
        browser.get((site / f'{build_docs.page_name(stem)}.html').as_uri())
        current = browser.find_element(By.CSS_SELECTOR, '.sidebar a.current').text
        h1 = browser.find_element(By.TAG_NAME, 'h1').text
        for shown in (browser.title, h1, current):
            assert shown.startswith(f'Lesson {n}: ') and f'Lesson {n}: Lesson' not in shown, (stem, shown)

# --- (b) lesson 01 in JupyterLab --------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

@pytest.fixture
def jupyterlab(tmp_path):
    "JupyterLab on 127.0.0.1, a free port and a token, serving a copy of lesson 01; stopped however the test ends."
    (tmp_path / 'lesson').mkdir()
    shutil.copy(ROOT / 'nbs' / '01_matmul.ipynb', tmp_path / 'lesson' / '01_matmul.ipynb')
    port, token = free_port(), uuid.uuid4().hex
    jupyter = Path(sys.executable).parent / 'jupyter'
    log = open(tmp_path / 'jupyterlab.log', 'w')
    proc = subprocess.Popen([str(jupyter), 'lab', '--no-browser', '--allow-root', '--ip=127.0.0.1', f'--port={port}',
                             f'--IdentityProvider.token={token}', f'--ServerApp.root_dir={tmp_path / "lesson"}',
                             '--ServerApp.port_retries=0'],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**{k: v for k, v in os.environ.items() if k != 'MPLBACKEND'},   # plots inline, as for a learner
                                 'JUPYTER_CONFIG_DIR': str(tmp_path / 'config'),
                                 'JUPYTERLAB_SETTINGS_DIR': str(tmp_path / 'settings'),
                                 'JUPYTERLAB_WORKSPACES_DIR': str(tmp_path / 'workspaces')})
    try:
        url = f'http://127.0.0.1:{port}'
        for _ in range(120):
            if proc.poll() is not None: pytest.fail(f"JupyterLab exited: {(tmp_path / 'jupyterlab.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f'{url}/api/status?token={token}', timeout=2): break
            except OSError: time.sleep(0.5)
        else: pytest.fail("JupyterLab did not answer within 60 s")
        yield url, token, tmp_path
    finally:
        proc.terminate()                                   # the server shuts its kernels down on the way out
        try: proc.wait(timeout=20)
        except subprocess.TimeoutExpired: pass
        try: os.killpg(proc.pid, signal.SIGKILL)          # anything of its session still running
        except ProcessLookupError: pass
        log.close()

def test_lesson_01_runs_in_jupyterlab(browser, jupyterlab):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    url, token, folder = jupyterlab
    browser.get(f'{url}/lab/tree/01_matmul.ipynb?token={token}')
    wait = WebDriverWait(browser, 90, poll_frequency=0.5)
    n_cells = len(cells('01_matmul'))
    wait.until(lambda d: d.execute_script(                    # every cell there, and the kernel started and idle
        "return document.querySelectorAll('.jp-Notebook .jp-Cell').length >= arguments[0] && "
        "document.querySelector('.jp-Notebook-ExecutionIndicator[data-status=\"idle\"]') !== null",
        n_cells))
    labels = lambda d: [e for e in d.find_elements(By.CSS_SELECTOR, '.lm-MenuBar-itemLabel') if e.text == 'Run']
    wait.until(labels)[0].click()                           # Run > Run All Cells, as a learner would
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "li[data-command='runmenu:run-all']"))[0].click()
    n_code = sum(c['cell_type'] == 'code' for c in cells('01_matmul'))
    done = ("const p = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].map(e => e.textContent);"
            "return [p.length, p.filter(t => /\\[\\d+\\]/.test(t)).length, p.filter(t => t.includes('*')).length]")
    hidden = sum(c['cell_type'] == 'code' and bool(c.get('metadata', {}).get('jupyter', {}).get('source_hidden'))
                 for c in cells('01_matmul'))                  # a folded solution's prompt stays blank in JupyterLab
    idle = "return document.querySelector('.jp-Notebook-ExecutionIndicator[data-status=\"idle\"]') !== null"
    WebDriverWait(browser, 100, poll_frequency=1).until(
        lambda d: (lambda n, ran, busy: ran == n - hidden and not busy)(*d.execute_script(done)) and d.execute_script(idle))
    total, ran, busy = browser.execute_script(done)
    assert total == n_code and ran == n_code - hidden
    errors = browser.execute_script(
        "return [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent)"
        ".filter(t => /Traceback|Error:/.test(t) && !/MNIST unavailable/.test(t)).map(t => t.slice(0, 300))")
    assert not errors, f"cells failed: {errors}"
    outputs = browser.execute_script("return document.querySelectorAll('.jp-OutputArea-output').length")
    images = browser.execute_script("return document.querySelectorAll('.jp-OutputArea-output img').length")
    saved = sum(bool(c.get('outputs')) for c in cells('01_matmul'))
    assert outputs >= saved, f"{outputs} outputs on the page, the saved lesson has {saved} cells with outputs"
    assert images >= 1, "the lesson's plot appears"
