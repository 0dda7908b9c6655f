"""The course on the web: the Quarto site's configuration stays correct, and tools/build_docs.py builds the site offline."""
import html, importlib, inspect, json, pkgutil, re, subprocess, sys
from pathlib import Path
import pytest, yaml

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / 'nbs'
sys.path.insert(0, str(ROOT / 'tools'))
import build_docs

def cells(stem):
    return json.loads((NBS / f'{stem}.ipynb').read_text())['cells']

def source(cell): return ''.join(cell['source'])

def directives(cell):
    return {m for m in re.findall(r'^\s*#\s*\|\s*([\w-]+)', source(cell), re.M)} if cell['cell_type'] == 'code' else set()

def sidebar_stems():
    return [s for _, stems in build_docs.course_order() for s in stems]

# --- 1. the Quarto site's configuration -------------------------------------------------------------------
def test_quarto_config_at_the_top_level_with_the_sidebar():
    cfg = yaml.safe_load((ROOT / '_quarto.yml').read_text())
    assert cfg['project']['type'] == 'website'
    assert 'sidebar.yml' in cfg['metadata-files'] and 'nbdev.yml' in cfg['metadata-files']
    assert (NBS / '_quarto.yml').resolve() == ROOT / '_quarto.yml', "nbs/_quarto.yml links to the top-level one"

def test_the_index_page_is_the_readmes_notebook():
    settings = (ROOT / 'settings.ini').read_text()
    assert re.search(r'^readme_nb\s*=\s*index\.ipynb\s*$', settings, re.M)
    assert sidebar_stems()[0] == 'index', "the sidebar opens with the index page"

def lesson_rank(stem):
    "0 for the index, 1 for a lesson (`NN_name`, NN below 90), 2 for a reference chapter (`03a_...`), 3 for the appendix (90*)."
    if stem == 'index': return 0
    number, letter = re.match(r'(\d+)([a-z]?)', stem).groups()
    return 3 if int(number) >= 90 else 2 if letter else 1

def course_number(stem):
    "`03a1_more` -> (3, 'a', 1): sub-notebooks follow their lesson, and 03a1 comes after 03a, before 03b."
    number, letter, sub = re.match(r'(\d+)([a-z]?)(\d*)', stem).groups()
    return int(number), letter, int(sub or 0)

def test_sidebar_lists_every_lesson_then_the_reference_chapters_then_the_appendix():
    stems = sidebar_stems()
    ranks = [lesson_rank(s) for s in stems]
    assert ranks == sorted(ranks), f"order should be index, every lesson, the reference chapters (03a_...), then 90*: {stems}"
    for rank in (1, 2, 3):
        group = [s for s in stems if lesson_rank(s) == rank]
        assert group == sorted(group, key=course_number), f"in number order: {group}"
    lessons = [course_number(s)[0] for s in stems if lesson_rank(s) == 1]
    assert lessons == list(range(1, len(lessons) + 1)), f"lessons numbered 1, 2, 3, ... without a gap: {lessons}"

def test_sidebar_sections_say_what_they_hold():
    "A section of lessons is titled 'Lessons...', of reference chapters 'Reference...', of the appendix 'Appendix...'."
    heads = {1: 'Lesson', 2: 'Reference', 3: 'Appendix'}
    for title, stems in build_docs.course_order():
        if title is None: assert stems == ['index']; continue
        kinds = {lesson_rank(s) for s in stems}
        assert len(kinds) == 1 and title.startswith(heads[kinds.pop()]), (title, stems)
        assert not re.search(r'\d', title), f"the pages number the lessons; a section's title repeats no number: {title}"

def test_every_numbered_notebook_is_in_the_sidebar():
    missing = sorted({p.stem for p in NBS.glob('[0-9]*.ipynb')} - set(sidebar_stems()))
    assert not missing, f"add to nbs/sidebar.yml: {missing}"

def public_objects():
    fastad = importlib.import_module('fastad')
    return {n: getattr(fastad, n) for n in build_docs.public_names()}

def test_every_public_name_of_fastad_has_a_docstring():
    missing = [n for n, o in public_objects().items() if not inspect.getdoc(o)]
    assert not missing, f"give these a docstring: {missing}"

def undocumented_exports():
    import fastad
    out = []
    for m in pkgutil.iter_modules(fastad.__path__):
        if m.name.startswith('_'): continue
        mod = importlib.import_module(f'fastad.{m.name}')
        out += [f'{m.name}.{n}' for n in getattr(mod, '__all__', [])
                if (inspect.isfunction(getattr(mod, n)) or inspect.isclass(getattr(mod, n))) and not inspect.getdoc(getattr(mod, n))]
    return out

def test_every_exported_function_has_a_docstring():
    missing = undocumented_exports()
    assert not missing, f"exported without a docstring ({len(missing)}): {missing}"

def exported_names(stem):
    """Public functions and classes a notebook's `#| export` cells define, named as nbdev's add_show_docs documents
    them: a method added with fastcore's `@patch` is `Class.method`."""
    import ast
    from nbdev.showdoc import showdoc_nm
    names = []
    for c in cells(stem):
        if c['cell_type'] != 'code' or not directives(c) & {'export', 'exports'} or 'hide' in directives(c): continue
        try: tree = ast.parse(re.sub(r'^\s*[%!].*$', '', source(c), flags=re.M))
        except SyntaxError: continue
        names += [showdoc_nm(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith('_')]
    return names

def test_every_notebook_that_exports_names_gets_a_page():
    "Its exported names are documented on its page (nbdev's add_show_docs; the site test checks each one's anchor)."
    exporting = [p.stem for p in sorted(NBS.glob('*.ipynb')) if exported_names(p.stem)]
    assert '03b_engine' in exporting and set(exporting) <= set(sidebar_stems())

# --- 2. the offline build ---------------------------------------------------------------------------------
def build_site(tmp_path_factory):
    "Build once per test session (both test files use it): the real command, in a fresh process."
    out = tmp_path_factory.getbasetemp() / 'site'
    if not (out / 'index.html').exists():
        run = subprocess.run([sys.executable, str(ROOT / 'tools' / 'build_docs.py'), '--out', str(out)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert 'warning' not in run.stderr, f"the build could not render everything:\n{run.stderr}"
    return out

@pytest.fixture(scope='session')
def site(tmp_path_factory): return build_site(tmp_path_factory)

def text(page):
    "A page's visible text, tags dropped and whitespace squeezed."
    body = re.sub(r'<(script|style)\b.*?</\1>', ' ', page, flags=re.S)
    return re.sub(r'\s+', ' ', html.unescape(re.sub(r'<[^>]+>', ' ', body))).strip()

def squeeze(s): return re.sub(r'\s+', '', s)   # highlighting splits code into tokens: compare without spaces

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_one_page_per_notebook_and_the_reference_pages(site):
    expected = {build_docs.page_name(s) for s in sidebar_stems()} | {'api', 'numpy', 'benchmarks'}
    assert {p.stem for p in site.glob('*.html')} == expected | set(build_docs.RENAMED)
    assert (site / 'site.css').stat().st_size > 1000

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
@pytest.mark.parametrize('stem', [p.stem for p in sorted(NBS.glob('[0-9]*.ipynb'))])
def test_a_notebook_page_shows_what_nbdev_shows(site, stem):
    page = (site / f'{build_docs.page_name(stem)}.html').read_text()
    shown = squeeze(text(page))
    assert '#|' not in shown, "directives are stripped from the code shown"
    title = re.search(r'^#\s+(.+)$', source(next(c for c in cells(stem) if c['cell_type'] == 'markdown')), re.M).group(1)
    title = build_docs.numbered(title, build_docs.lesson_number(stem))
    assert f'<title>{html.escape(title, quote=False)} · fastad</title>' in page
    for c in cells(stem):
        d = directives(c)
        body = squeeze(re.sub(r'^\s*#\s*\|.*$', '', source(c), flags=re.M))
        if 'code-fold' in d and re.search(r'^\s*#\s*\|\s*code-fold:\s*true', source(c), re.M):
            summary = re.search(r'^\s*#\s*\|\s*code-summary:\s*"?([^"\n]*)', source(c), re.M)
            fold = re.escape(f'<details class="fold"><summary>{summary.group(1) if summary else "Code"}</summary>')
            folded = [squeeze(text(m)) for m in re.findall(fold + r'(.*?)</details>', page, re.S)]
            assert body in folded, f"a code-fold cell is not folded under its summary: {body[:80]}"
        elif d & {'hide', 'export', 'exporti', 'default_exp'} and len(body) > 30:
            assert body not in shown, f"a {sorted(d)} cell is on the page: {body[:80]}"
        elif c['cell_type'] == 'code' and not d and len(body) > 10:
            assert body in shown, f"a code cell is missing from the page: {body[:80]}"
            for o in c.get('outputs', []):          # its saved outputs, as text or as an image
                txt = squeeze(''.join(o.get('text', '') or o.get('data', {}).get('text/plain', '')))
                if 'image/png' in o.get('data', {}): assert o['data']['image/png'][:60].strip() in page
                elif txt and o.get('output_type') != 'error': assert html.unescape(txt)[:200] in shown
    for name in exported_names(stem):
        assert f'id="{name.lower()}"' in page, f"exported {name} has no documentation on its page"

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_math_is_mathml_and_needs_no_script(site):
    page = (site / 'fully_connected.html').read_text()
    assert page.count('<math') >= 10 and '$\\sqrt{784}$' not in text(page)
    for p in site.glob('*.html'):
        pg = p.read_text()
        assert '<script' not in pg and not re.search(r'(src|href)="(https?:)?//', pg.split('<article', 1)[0]), \
            f"{p.name} loads something from the web"

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_links_between_pages_resolve(site):
    ids = {p.name: set(re.findall(r'\bid="([^"]+)"', p.read_text())) for p in site.glob('*.html')}
    broken = []
    for p in site.glob('*.html'):
        for href in re.findall(r'href="([^"]+)"', p.read_text()):
            if re.match(r'[a-z]+:', href) or href.startswith('//'): continue
            target, _, frag = href.partition('#')
            target = target or p.name
            if target.endswith('.css'): continue
            if target not in ids or (frag and frag not in ids[target]): broken.append(f'{p.name} -> {href}')
    assert not broken, broken

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_index_lists_the_course_in_sidebar_order(site):
    page = (site / 'index.html').read_text()
    contents = page.split('id="contents"', 1)[1]
    linked = re.findall(r'<li><a href="([\w.-]+)\.html"', contents)
    assert linked == [build_docs.page_name(s) for s in sidebar_stems() if s != 'index']
    assert 'What this is' in text(page), "the index carries the README's content"

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_api_reference_documents_every_public_name(site):
    page = (site / 'api.html').read_text()
    for name, obj in public_objects().items():
        assert f'id="{name.lower()}"' in page, name
        first = (inspect.getdoc(obj) or '').split('\n')[0]
        assert squeeze(html.unescape(re.sub(r'`', '', first)))[:40] in squeeze(text(page)), name
    groups = re.findall(r'<h2 id="(fastad\.\w+|modules)"', page)
    homes = {f"fastad.{m}": s for s in sidebar_stems() if (NBS / f'{s}.ipynb').exists()
             for m in re.findall(r'#\s*\|\s*default_exp\s+(\w+)', (NBS / f'{s}.ipynb').read_text())}
    made = [g for g in groups if g != 'modules']
    assert all(g in homes for g in made), f"every module's group is made by a notebook in the sidebar: {made}"
    in_order = sorted(made, key=lambda g: sidebar_stems().index(homes[g]))
    assert made == in_order and groups[-1] == 'modules', f"grouped in the order of the notebooks making them: {groups}"
    assert page.index('<code>fastad.primitives</code>') < page.index('<code>fastad.transforms</code>') \
        < page.index('<code>fastad.layers</code>') < page.index('<code>fastad.backend</code>'), "the sidebar's order"

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_numpy_table_is_the_registry(site):
    """The page is fastad.dispatch.supported_functions(), grouped as it groups them; the plain list is what the engine
    runs without a derivative (NONDIFFERENTIABLE, less what a primitive or adapter takes first)."""
    D, P, E = (importlib.import_module(f'fastad.{m}') for m in ('dispatch', 'primitives', 'engine'))
    supported = {g: ns for g, ns in D.supported_functions().items() if not g.startswith("scipy.")}   # NumPy's alone (SciPy's: 03g)
    page = (site / 'numpy.html').read_text()
    table, rest = page.split('id="nondifferentiable"', 1)
    functions = {g: ns for g, ns in supported.items() if g != 'method forms'}
    rows = re.findall(r'<tr><td><code>(numpy\.[\w.]+)</code>', table)
    assert rows == [n for ns in functions.values() for n in ns], "every supported function once, group by group"
    assert re.findall(r'<h2 id="[\w-]+">([\w ]+)</h2>', table)[:len(supported)] == list(supported), "its groups, in its order"
    for method in supported.get('method forms', []): assert f'<code>{method}</code>' in table, method
    registered = set(P.REGISTRY)
    plain = set(re.findall(r'<code>(numpy\.[\w.]+)</code>', rest))
    assert plain == {D._public_name(f) for f in P.NONDIFFERENTIABLE - registered}     # numpy.linalg.matrix_rank, ...
    assert not plain & set(rows), "a function is either differentiated or run on plain values, never both"

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_benchmarks_page_shows_the_benchmarks_tables(site):
    "bench/README.md, then the suite's table (bench/results.md) and its chart (bench/results.png)."
    page = (site / 'benchmarks.html').read_text()
    results = (ROOT / 'bench' / 'results.md').read_text()
    header = next(l for l in results.splitlines() if l.startswith('| workload'))
    cols = [c.strip() for c in header.strip('|').split('|')]
    assert '<table>' in page and squeeze(''.join(f'<th>{html.escape(c)}</th>' for c in cols)) in squeeze(page), \
        "results.md's main table, its header as the suite wrote it"
    first_row = next(l for l in results.splitlines() if l.startswith('|') and not l.startswith(('| workload', '|---')))
    assert squeeze(first_row.strip('|').split('|')[0]) in squeeze(text(page))
    assert text(page).index('Benchmarks') < text(page).index('fastad benchmark results'), "the README first"
    img = re.search(r'<img [^>]*src="([\w.-]+\.png)"', page)
    assert img and (site / img.group(1)).read_bytes() == (ROOT / 'bench' / 'results.png').read_bytes(), "the chart"

# --- 3. reading a lesson: checks folded, long lines scrolled, the course table linked, lessons numbered --------
def folded(page, css_class):
    "[(summary, the folded code, squeezed)] of a page's `<details class=css_class>`, in page order."
    return [(html.unescape(m.group(1)), squeeze(text(m.group(2))))
            for m in re.finditer(rf'<details class="{css_class}"><summary>(.*?)</summary>(.*?)</details>', page, re.S)]

def test_a_cell_that_only_checks_is_a_guard():
    "Decided from the source by ast: every top-level statement a `test_*`/`check_*` call or an assert; grading is not."
    guard, shown = build_docs.is_guard, lambda src: not build_docs.is_guard(src)
    assert guard("test_eq(f(2), 4)\ntest_close(g(1.0), 0.5, eps=1e-9)\nassert h() is None")
    assert guard("check_vwc(vwc_sin, 0.3)") and guard("fd.testing.check_vwc(vwc_sin, 0.3)")
    assert guard("test_fail(lambda: f('x'), contains='f')") and guard("for x in xs: test_eq(f(x), x)")
    assert shown("grade(my_softplus)"), "an exercise's grading cell stays in view"
    assert shown("y = f(2)\ntest_eq(y, 4)") and shown("f(2)") and shown("") and shown("%time f(2)")
    assert shown("for x in xs:\n    y = f(x)\n    test_eq(y, x)")

LESSON_01 = '01_matmul'

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_guard_cells_are_folded_in_place(site):
    "Lesson 01's cells that only check show folded under 'checks', where they stand; every other cell in full."
    page = (site / f'{build_docs.page_name(LESSON_01)}.html').read_text()
    guards, kept = [], []
    for c in cells(LESSON_01):
        d, body = directives(c), re.sub(r'^\s*#\s*\|.*$', '', source(c), flags=re.M).strip()
        if c['cell_type'] != 'code' or d & {'hide', 'export', 'exporti', 'exports', 'default_exp'} or not body: continue
        (guards if build_docs.is_guard(body) and not c.get('outputs') else kept).append(squeeze(body))
    checks = folded(page, 'guard')
    assert len(guards) >= 5 and [b for _, b in checks] == guards, "every guard cell folded, in order, none else"
    assert {s for s, _ in checks} == {'checks'}
    unfolded = squeeze(text(re.sub(r'<details class="guard">.*?</details>', '', page, flags=re.S)))
    assert all(b in unfolded for b in kept if len(b) > 10), "the cells that teach stay in view"
    order = [squeeze(source(c)) for c in cells(LESSON_01)]
    where = lambda b: next(i for i, o in enumerate(order) if b in o)
    at = squeeze(text(page)).index
    between = sorted(kept + guards, key=where)
    assert [b for b in between if len(b) > 10] == sorted((b for b in between if len(b) > 10), key=at), \
        "each in its place among the cells that teach, not moved"

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_solutions_fold_under_their_summary_and_grading_stays_shown(site):
    "Lesson 04's exercises: `#| code-fold: true` (and Jupyter's source_hidden) -> folded under 'Solution'; grade(...) shown."
    stem = '04_custom_derivatives'
    page = (site / f'{build_docs.page_name(stem)}.html').read_text()
    hidden = [c for c in cells(stem) if c['cell_type'] == 'code' and c.get('metadata', {}).get('jupyter', {}).get('source_hidden')]
    assert hidden and all(re.search(r'^#\|\s*code-fold:\s*true', source(c), re.M) for c in hidden)
    solutions = folded(page, 'fold')
    for c in hidden:
        body = squeeze(re.sub(r'^\s*#\s*\|.*$', '', source(c), flags=re.M))
        assert ('Solution', body) in solutions, f"a solution is not folded under 'Solution': {body[:60]}"
    grading = [squeeze(source(c)) for c in cells(stem) if c['cell_type'] == 'code' and re.search(r'^grade\(', source(c), re.M)]
    assert grading and all(g in squeeze(text(page)) for g in grading)
    assert not any(g in b for g in grading for _, b in folded(page, 'guard') + solutions), "grading cells stay in view"

def css_rules(css):
    "{selector: declarations} of a stylesheet (comments dropped; a rule's selector list split)."
    css = re.sub(r'/\*.*?\*/', '', css, flags=re.S)
    return {sel.strip(): body for sels, body in re.findall(r'([^{}]+)\{([^}]*)\}', css) for sel in sels.split(',')}

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_code_scrolls_sideways_instead_of_being_cut_off(site):
    "Code cells, code in the prose (the install command) and outputs: a long line scrolls inside its block."
    rules = css_rules((site / 'site.css').read_text())
    for sel in ('.input_area pre', '.text_cell_render pre', '.output_area'):
        assert re.search(r'overflow-x:\s*auto', rules.get(sel, '')), f"{sel} should scroll sideways"
    assert re.search(r'white-space:\s*pre\b(?!-)', rules['.input_area pre']), "code keeps its lines: no wrapping"
    quarto = yaml.safe_load((ROOT / '_quarto.yml').read_text())
    assert quarto['format']['html'].get('code-overflow') == 'scroll', "and on the Quarto site"
    assert re.search(r'overflow-x:\s*auto', css_rules((NBS / 'styles.css').read_text()).get('pre', ''))

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_the_course_table_links_each_notebook_to_its_page(site):
    "The index's table names notebooks (`01_matmul`): each is a link to that notebook's page."
    page = (site / 'index.html').read_text()
    table = ''.join(re.findall(r'<table\b.*?</table>', page.split('id="contents"')[0], re.S))   # lessons, then reference
    named = re.findall(r'<code>(\d\w*)</code>', table)
    linked = re.findall(r'<a href="([\w.-]+)\.html"><code>(\d\w*)</code></a>', table)
    assert sorted(named) == sorted(p.stem for p in NBS.glob('[0-9]*.ipynb')) and [s for _, s in linked] == named, "every notebook the table names is linked"
    assert all(href == build_docs.page_name(s) and (site / f'{href}.html').exists() for href, s in linked)

def lessons():
    return [(s, build_docs.lesson_number(s)) for s in sidebar_stems() if build_docs.lesson_number(s) is not None]

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_every_lesson_carries_its_number(site):
    """`NN_name` is lesson N: "Lesson N: title" in its page's title and heading, in the sidebar and the index; once
    only where the notebook's title already says so; reference pages (03a_...) and the appendix (90_...) unnumbered."""
    assert [n for _, n in lessons()] == list(range(1, 13)), lessons()
    index = (site / 'index.html').read_text()
    for stem, n in lessons():
        page = (site / f'{build_docs.page_name(stem)}.html').read_text()
        title = re.search(r'<title>(.*?) · fastad</title>', page).group(1)
        assert title.startswith(f'Lesson {n}: ') and not re.match(r'Lesson \d+: Lesson', title), title
        assert re.search(rf'<h1[^>]*>{re.escape(title)}', page), f"{stem}: the page's heading"
        assert f'aria-current="page">{title}</a>' in page, f"{stem}: the sidebar"
        assert f'<a href="{build_docs.page_name(stem)}.html">{title}</a>' in index, f"{stem}: the index's contents"
    for stem in ('03a_primitives', '07c_planner', '90_backend'):
        page = (site / f'{build_docs.page_name(stem)}.html').read_text()
        assert not re.search(r'<title>Lesson', page), f"{stem} is a reference page, not a lesson"
    assert build_docs.numbered('Lesson 12: SciPy in the loss', 12) == 'Lesson 12: SciPy in the loss'

# --- 4. old names keep working ------------------------------------------------------------------------------
def test_each_renamed_notebook_is_gone_under_its_old_name_and_present_under_its_new_one():
    for old, new in build_docs.RENAMED.items():
        assert not (NBS / f'{old}.ipynb').exists() and (NBS / f'{new}.ipynb').exists(), (old, new)
        assert new in sidebar_stems(), new

@pytest.mark.slow   # builds the site (about 20 s): CI's slow phase runs it
def test_an_old_name_redirects_to_its_new_page(site):
    "`05b_classifier.html` sends the browser to `classifier.html` at once, with a link; each new page keeps its URL."
    assert build_docs.RENAMED['05b_classifier'] == '05_classifier' and build_docs.RENAMED['05_checkpointing'] == '07_checkpointing'
    for old, new in build_docs.RENAMED.items():
        target = f'{build_docs.page_name(new)}.html'
        page = (site / f'{old}.html').read_text()
        assert re.search(rf'<meta http-equiv="refresh" content="0; url={re.escape(target)}">', page), (old, page)
        assert f'<a href="{target}">' in page and (site / target).exists(), (old, target)
        assert '<meta http-equiv="refresh"' not in (site / target).read_text(), f"{target} is the page, not a redirect"
    assert (site / 'checkpointing.html').read_text().count('<title>Lesson 7: ') == 1, "the page name stays; its number is 7"
