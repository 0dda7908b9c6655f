"""Build the course as a static website, offline: `python tools/build_docs.py [--out _site]`.

Every notebook that nbs/sidebar.yml lists, in its order, rendered by nbconvert's HTML exporter from its saved
outputs (nothing runs), with its cells treated as nbdev treats them for its Quarto site: `#| hide` and
`#| export` cells left out, each exported name documented where it is defined, directives stripped from the
code shown. Math becomes MathML, which browsers draw without any script, so the pages need nothing from the
web. `#| code-fold` cells show their code folded under a summary, as Quarto does; a cell that only checks
(every statement a `test_*`/`check_*` call or an `assert`, and no output) shows folded under "checks". Each
lesson (`NN_name.ipynb`, NN below 90) is titled "Lesson N: ..." on its page, in the sidebar and in the index,
whose course table links each notebook it names to its page. Beside the lessons: the index
(the README's notebook and the contents in course order), an API reference of every public name of `fastad`
(grouped by module, in the sidebar's order of the notebooks making them), the NumPy functions fastad
differentiates (`fastad.dispatch.supported_functions()`, by group), and the benchmarks (bench/README.md, then the
suite's table and chart). A notebook renamed when the course was reordered keeps its old name working: `RENAMED`
lists them, and each old name gets a page that redirects to the new one."""
import argparse, ast, html, importlib, inspect, re, shutil, sys, warnings
from pathlib import Path

import jinja2, nbformat, yaml
from jinja2 import pass_context
from latex2mathml.converter import convert as latex_to_mathml
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbdev.process import NBProcessor
from nbdev.processors import (add_show_docs, clean_magics, hide_, hide_line, mv_exports, populate_language,
                              rm_export, rm_header_dash, strip_ansi)
from pygments.formatters import HtmlFormatter
from traitlets.config import Config

ROOT = Path(__file__).resolve().parent.parent
NBS, ASSETS = ROOT / 'nbs', Path(__file__).resolve().parent / 'docs'
sys.path.insert(0, str(ROOT))                  # document this checkout's fastad, whatever else is installed
problems = []                                  # what the build could not render: printed, and a test expects none

def problem(msg):
    problems.append(msg); print(f"warning: {msg}", file=sys.stderr)

# --- markdown: nbconvert's renderer, with MathML and links between pages -----------------------------------
def page_name(stem):
    "A notebook's page, named as nbdev names it (`03a_primitives` -> `primitives`), so links in fastad/_modidx.py work."
    return re.sub(r'^\d+[a-zA-Z0-9]*_', '', stem.lower())

def page_url(url):
    "A link to a notebook becomes a link to its page."
    m = re.match(r'^([\w.-]+)\.ipynb(#.*)?$', url)
    return f'{page_name(m.group(1))}.html{m.group(2) or ""}' if m else url

def mathml(tex, display):
    try: return latex_to_mathml(tex, display=display)
    except Exception as e:                                      # show the TeX rather than lose the sentence
        problem(f"math not converted ({type(e).__name__}): {tex}")
        return f'<code class="tex">{html.escape(tex)}</code>'

class CourseRenderer(IPythonRenderer):
    "nbconvert's markdown renderer, drawing math as MathML (no script needed) and linking notebooks to their pages."
    def inline_math(self, body):                                   # a long formula scrolls inside the column
        return mathml(body, 'inline') if len(body) <= 70 else f'<span class="wide-math">{mathml(body, "inline")}</span>'
    def block_math(self, body): return f'<span class="wide-math display">{mathml(body, "block")}</span>'
    def latex_environment(self, name, body): return mathml(f'\\begin{{{name}}}{body}\\end{{{name}}}', 'block')
    def link(self, text, url, title=None): return super().link(text, page_url(url), title)

def markdown(text, **kw): return MarkdownWithMath(renderer=CourseRenderer(escape=False, **kw)).render(text)

class CourseExporter(HTMLExporter):
    "nbconvert's basic HTML body, with the course's markdown renderer."
    @pass_context
    def markdown2html(self, context, source):
        cell = context.get('cell', {})
        return markdown(source, attachments=cell.get('attachments', {}), anchor_link_text='#')

def exporter():
    c = Config()
    c.TagRemovePreprocessor.update(enabled=True, remove_cell_tags={'remove-cell'}, remove_input_tags={'remove-input'},
                                   remove_all_outputs_tags={'remove-output'})
    return CourseExporter(config=c, template_name='basic', extra_template_paths=[str(ASSETS)],
                          template_file='course.html.j2', exclude_input_prompt=True, exclude_output_prompt=True)

# --- documentation of one name, as nbdev's show_doc gives it -----------------------------------------------
def anchor(name): return name.lower()                           # nbdev's anchors, as fastad/_modidx.py links them

def doc_block(name, obj):
    "A name's signature and docstring as HTML: what nbdev's `show_doc` shows."
    if inspect.isclass(obj):
        bases = [b.__name__ for b in obj.__bases__ if b is not object]
        sig = f"class {name}" + (f"({', '.join(bases)})" if bases else '')
    elif inspect.ismodule(obj): sig = f"module {obj.__name__}"
    else:
        try: sig = inspect.signature(obj)
        except (TypeError, ValueError): sig = None
        if sig is not None and '.' in name and inspect.isfunction(obj) and list(sig.parameters)[:1] == ['self']:
            sig = sig.replace(parameters=list(sig.parameters.values())[1:])   # `Class.method(along)`, as nbdev shows it
        sig = f"{name}{sig}" if sig is not None else name
    doc = inspect.getdoc(obj) if (inspect.isclass(obj) or callable(obj) or inspect.ismodule(obj)) else None
    return (f'<div class="doc" id="{anchor(name)}"><pre class="sig"><code>{html.escape(sig)}</code></pre>'
            f'{markdown(doc or "", exclude_anchor_links=True)}</div>')

def lookup(dotted, modules):
    "The object named `dotted` (`f` or `Class.method`) in the first of `modules` that has it."
    for mod in modules:
        obj = mod
        try:
            for part in dotted.split('.'): obj = getattr(obj, part)
            return obj
        except AttributeError: continue
    return None

# --- one notebook -> one page ------------------------------------------------------------------------------
_QUARTO_OPT = re.compile(r'^\s*#\s*\|\s*([\w-]+)\s*:\s*(.*?)\s*$')
_SHOW_DOC = re.compile(r'^\s*show_doc\(\s*([\w.]+)')

def _guard_statement(node):
    "A statement that only checks: `assert ...`, a call of `test_*`/`check_*`, or a loop or `with` of such statements."
    if isinstance(node, ast.Assert): return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        f = node.value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ''
        return bool(re.match(r'(test|check)_\w+$', name))     # `grade(...)` is an exercise's grading: it stays shown
    if isinstance(node, (ast.For, ast.With)) and not getattr(node, 'orelse', None):
        return all(map(_guard_statement, node.body))
    return False

def is_guard(source):
    "True for code that only checks what the cells before it did (every top-level statement a check): shown folded."
    try: body = ast.parse(source).body
    except SyntaxError: return False
    return bool(body) and all(map(_guard_statement, body))

def lesson_number(stem):
    "A lesson's number from its file name: `04_custom_derivatives` -> 4; None for reference pages (`07c_planner`), the 90s, the index."
    m = re.match(r'(\d+)_', stem)
    return int(m.group(1)) if m and 0 < int(m.group(1)) < 90 else None

def numbered(title, number):
    "`Lesson 4: Custom derivatives`; a title that already starts with `Lesson N` keeps its own."
    return title if number is None or re.match(r'Lessons?\s+\d', title) else f'Lesson {number}: {title}'

def read_title(nb):
    "(title, summary) from the notebook's first markdown cell: `# Title` and `> summary`, as nbdev reads them."
    for cell in nb.cells:
        if cell.cell_type != 'markdown': continue
        title = re.search(r'^#\s+(.+)$', cell.source, re.M)
        summary = re.search(r'^>\s*(.+)$', cell.source, re.M)
        return (title.group(1).strip() if title else None), (summary.group(1).strip() if summary else '')
    return None, ''

def export_modules(path):
    "The fastad modules a notebook exports to (its `default_exp` first), imported, for its show_doc cells."
    src = path.read_text()
    names = re.findall(r'#\s*\|\s*default_exp\s+([\w.]+)', src) + re.findall(r'#\s*\|\s*exports?i?\s+([\w.]+)', src)
    mods = []
    for n in dict.fromkeys(names):
        try: mods.append(importlib.import_module(f'fastad.{n}'))
        except Exception as e: problem(f"{path.name}: cannot import fastad.{n} to document it: {e}")
    return mods + [importlib.import_module('fastad')]

def joined(v): return ''.join(v) if isinstance(v, list) else v

def output(o):
    "A saved output as nbformat holds it: multi-line strings joined (nbdev's reader keeps them as lists of lines)."
    o = nbformat.from_dict(dict(o))
    if 'text' in o: o.text = joined(o.text)
    if 'data' in o: o.data = {k: joined(v) for k, v in o.data.items()}
    return o

def notebook_for_the_page(path, number=None):
    """The notebook as nbdev's docs show it: hidden and exported cells out, show_doc for exported names, directives off;
    a lesson's `# Title` numbered (`# Lesson 4: Title`)."""
    proc = NBProcessor(path, procs=[populate_language, add_show_docs, strip_ansi, hide_line, rm_header_dash,
                                    rm_export, clean_magics, hide_, mv_exports])
    proc.process()
    modules, cells = export_modules(path), []
    for c in proc.nb.cells:
        if c.cell_type == 'markdown':
            cells.append(nbformat.v4.new_markdown_cell(c.source, attachments=c.get('attachments')) if c.get('attachments')
                         else nbformat.v4.new_markdown_cell(c.source))
            continue
        if c.cell_type != 'code': continue
        lines = c.source.splitlines()
        opts = {}
        while lines and _QUARTO_OPT.match(lines[0]):                 # Quarto's cell options, which nbdev leaves
            k, v = _QUARTO_OPT.match(lines.pop(0)).groups(); opts[k] = v.strip('"\'')
        source = '\n'.join(lines).strip()
        shown = _SHOW_DOC.match(source)
        if shown:                                                    # show_doc(name): the name's documentation
            obj = lookup(shown.group(1), modules)
            if obj is None: problem(f"{path.name}: show_doc({shown.group(1)}) names nothing in {[m.__name__ for m in modules]}")
            else: cells.append(nbformat.v4.new_markdown_cell(doc_block(shown.group(1), obj)))
            continue
        tags = [t for k, t in (('include', 'remove-cell'), ('echo', 'remove-input'), ('output', 'remove-output'))
                if opts.get(k, '').lower() == 'false']
        if not source and not c.get('outputs'): continue
        cell = nbformat.v4.new_code_cell(source, outputs=[output(o) for o in c.get('outputs', [])])
        if tags: cell.metadata['tags'] = tags
        if opts.get('code-fold', '').lower() in ('true', 'show'):       # folded under its summary, as Quarto shows it
            cell.metadata['fold'] = {'summary': opts.get('code-summary', 'Code'), 'open': opts['code-fold'].lower() == 'show'}
        elif not cell.outputs and not tags and is_guard(source):      # only checks: in place, folded under "checks"
            cell.metadata['fold'] = {'summary': 'checks', 'class': 'guard'}
        cells.append(cell)
    first = next((c for c in cells if c.cell_type == 'markdown'), None)
    if first is not None and number is not None:
        first.source = re.sub(r'^(#\s+)(.+)$', lambda m: m.group(1) + numbered(m.group(2).strip(), number), first.source, count=1, flags=re.M)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata['language_info'] = {'name': 'python', 'pygments_lexer': 'ipython3'}
    return nb

def render_notebook(path):
    "(title, summary, body HTML) of a notebook's page."
    nb = notebook_for_the_page(path, lesson_number(path.stem) if path.parent == NBS else None)
    title, summary = read_title(nb)
    if not title: problem(f"{path.name} has no '# Title' in its first markdown cell")
    body, _ = exporter().from_notebook_node(nb)
    return title or path.stem, summary, body

# --- the course's order ------------------------------------------------------------------------------------
def course_order(sidebar=NBS / 'sidebar.yml'):
    "[(section title or None, [notebook stems])] in the order of nbs/sidebar.yml (what Quarto's sidebar shows)."
    sections = []
    for item in yaml.safe_load(sidebar.read_text())['website']['sidebar']['contents']:
        if isinstance(item, str): sections.append((None, [Path(item).stem]))
        else: sections.append((item.get('section'), [Path(p).stem for p in item.get('contents', [])]))
    listed = {s for _, stems in sections for s in stems}
    unlisted = sorted(p.stem for p in NBS.glob('[0-9]*.ipynb') if p.stem not in listed)
    if unlisted:
        problem(f"notebooks missing from nbs/sidebar.yml (shown last): {unlisted}")
        sections.append(('Not yet in the sidebar', unlisted))
    return sections

# --- the API reference -------------------------------------------------------------------------------------
def public_names(init=ROOT / 'fastad' / '__init__.py'):
    "Every name that fastad/__init__.py makes public, in its order (`from m import *` counts m's __all__)."
    names = []
    for node in ast.parse(init.read_text()).body:
        if not isinstance(node, ast.ImportFrom): continue
        for alias in node.names:
            if alias.name == '*': names += importlib.import_module(f'fastad.{node.module}').__all__
            else: names.append(alias.asname or alias.name)
    return [n for n in dict.fromkeys(names) if not n.startswith('_')]

def modidx():
    "nbdev's index: module -> notebook page, and fastad.module.name -> its anchor on that page."
    d = importlib.import_module('fastad._modidx').d['syms']
    pages = {mod: next(iter(syms.values()))[0].split('#')[0] for mod, syms in d.items() if syms}
    return pages, {k: v[0] for syms in d.values() for k, v in syms.items()}

def module_homes(order):
    "fastad.module -> the notebook whose `default_exp` makes it, for the notebooks in the course (in its order)."
    homes = {}
    for stem in (s for _, stems in order for s in stems):
        path = NBS / f'{stem}.ipynb'
        if not path.exists(): continue
        for mod in re.findall(r'#\s*\|\s*default_exp\s+([\w.]+)', path.read_text()): homes.setdefault(f'fastad.{mod}', stem)
    return homes

def api_reference(order, titles={}):
    """HTML of the API reference: each public name's signature and docstring, grouped by the module defining it,
    the modules in the order of the notebooks that make them (the sidebar's order)."""
    fastad = importlib.import_module('fastad')
    pages, links = modidx()
    rank = {stem: i for i, stem in enumerate(s for _, stems in order for s in stems)}
    homes = module_homes(order)
    pages.update({mod: f'{page_name(stem)}.html' for mod, stem in homes.items()})
    groups = {}
    for name in public_names():
        obj = getattr(fastad, name)
        mod = obj.__name__ if inspect.ismodule(obj) else getattr(obj, '__module__', 'fastad')
        groups.setdefault('modules' if inspect.ismodule(obj) else mod, []).append((name, obj))
    def where(mod): return rank.get(homes.get(mod), len(rank))
    out = ['<h1>API reference</h1>', '<p class="lead">Every name that <code>import fastad</code> gives you, '
           'grouped by the module that defines it, in course order. Each links to the lesson that builds it.</p>']
    for mod in sorted(groups, key=lambda m: (m == 'modules', where(m), m)):
        page = pages.get(mod)
        head = 'Modules' if mod == 'modules' else f'<code>{mod}</code>'
        out.append(f'<h2 id="{mod}">{head}</h2>')
        if page: out.append(f'<p class="from">Built in <a href="{page}">{html.escape(titles.get(page[:-5], page[:-5]))}</a>.</p>')
        for name, obj in groups[mod]:
            full = obj.__name__ if inspect.ismodule(obj) else f'{mod}.{getattr(obj, "__name__", name)}'
            link = pages.get(full) if inspect.ismodule(obj) else links.get(full)
            block = doc_block(name, obj)
            if link: block = block.replace('</pre>', f'</pre><p class="from"><a href="{link}">in the lesson</a></p>', 1)
            out.append(block)
    return '\n'.join(out)

# --- the NumPy functions fastad differentiates -------------------------------------------------------------
def numpy_name(f):
    "`numpy.add`, `numpy.linalg.norm`: a NumPy callable by its public name (as fastad.dispatch names it)."
    module = getattr(f, '__module__', None) or 'numpy'
    return f"{'numpy' if module.startswith('numpy._') else module}.{f.__name__}"

def numpy_function(name):
    "The NumPy callable that a public name such as `numpy.linalg.norm` names, or None."
    parts = name.split('.')
    for i in range(len(parts) - 1, 0, -1):                          # the longest importable module, then attributes
        try: obj = importlib.import_module('.'.join(parts[:i]))
        except ImportError: continue
        try:
            for part in parts[i:]: obj = getattr(obj, part)
            return obj
        except AttributeError: return None
    return None

def registry():
    """(supported, refused, nondifferentiable) from fastad's own tables: `fastad.dispatch.supported_functions()`
    ({group: [names]}, the array methods last), the functions it recognises only to refuse with advice, and the
    names it runs on plain values (NONDIFFERENTIABLE less any that a primitive or adapter differentiates, as the
    engine looks those up first)."""
    D, P = importlib.import_module('fastad.dispatch'), importlib.import_module('fastad.primitives')
    import numpy as np
    supported = {g: ns for g, ns in D.supported_functions().items() if not g.startswith("scipy.")}   # SciPy's are listed in 03g
    listed = {n for names in supported.values() for n in names}
    registered = set(P.REGISTRY) - {np.ufunc}
    refused = sorted(n for n in map(numpy_name, registered) if n not in listed and n.startswith('numpy'))
    plain = sorted(n for n in map(numpy_name, P.NONDIFFERENTIABLE - registered) if n not in listed)
    return supported, refused, plain

def vwc_html(vwc):
    "A VWC's code, the derivative beside the forward: shown whole when short, folded when long."
    try: src = inspect.getsource(vwc)
    except (OSError, TypeError): return html.escape(inspect.getdoc(vwc) or '')
    lines = [l for l in inspect.cleandoc(src).splitlines() if not l.lstrip().startswith('@')]
    code = highlight_python('\n'.join(lines))
    return code if len(lines) <= 3 else f'<details><summary><code>{html.escape(lines[0])}</code></summary>{code}</details>'

def highlight_python(code):
    from pygments import highlight
    from pygments.lexers import PythonLexer
    return highlight(code, PythonLexer(), HtmlFormatter())

def slug(text): return re.sub(r'[^a-z0-9]+', '-', text.lower()).strip('-')

def numpy_row(name, links, dispatch_page):
    "One function's row: its name, how it reaches fastad, the primitive and that primitive's VWC."
    import numpy as np
    P, E = importlib.import_module('fastad.primitives'), importlib.import_module('fastad.engine')
    f = numpy_function(name)
    if f is None: problem(f"supported_functions() names {name}, which NumPy does not have"); return ''
    ufunc = isinstance(f, np.ufunc)
    row = P.REGISTRY.get(f)
    prim, adapter = (row.rule, None if ufunc else row.adapt) if row else (None, None)   # the engine asks the adapter first
    vwc = getattr(prim, 'vwc', None)
    link = links.get(f'{vwc.__module__}.{vwc.__name__}') if vwc else None
    how = 'ufunc' if ufunc else ('adapter' if adapter else 'function')
    prim_cell = (f'<a href="{link}"><code>{prim.name}</code></a>' if link else f'<code>{prim.name}</code>') if prim else ''
    if adapter and not vwc:
        derivative = f'<span class="from"><a href="{dispatch_page}">composed of primitives</a></span>'
    else: derivative = vwc_html(vwc) if vwc else '<span class="from">a custom derivative</span>'
    return f'<tr><td><code>{name}</code></td><td>{how}</td><td>{prim_cell}</td><td>{derivative}</td></tr>'

def numpy_table():
    "HTML of the NumPy functions fastad differentiates, grouped as `supported_functions()` groups them, and those without."
    supported, refused, plain = registry()
    _, links = modidx()
    dispatch_page = f"{page_name('03b1_numpy_dispatch')}.html"
    functions = {g: names for g, names in supported.items() if g != 'method forms'}
    n = sum(map(len, functions.values()))
    out = [f'<h1>NumPy functions fastad differentiates</h1>\n<p class="lead">Inside <code>gradient</code> and the '
           f'other transforms, these {n} NumPy functions take part in differentiation: a ufunc through '
           f'<code>__array_ufunc__</code>, a function through <code>__array_function__</code> (an adapter maps its '
           f'arguments onto primitives). Each primitive links to its value-with-chain function. Made from '
           f'<code>fastad.dispatch.supported_functions()</code>, which reads the registry, so it is always the real list.</p>',
           '<p class="names">' + ' · '.join(f'<a href="#{slug(g)}">{html.escape(g)}</a>' for g in supported) + '</p>']
    for group, names in functions.items():
        rows = '\n'.join(numpy_row(name, links, dispatch_page) for name in names)
        out.append(f'<h2 id="{slug(group)}">{html.escape(group)}</h2>\n<table class="registry"><thead><tr><th>NumPy</th>'
                   f'<th>kind</th><th>primitive</th><th>its VWC: the value and the chain</th></tr></thead><tbody>\n'
                   f'{rows}\n</tbody></table>')
    if supported.get('method forms'):
        out.append(f'<h2 id="{slug("method forms")}">method forms</h2>\n<p>A traced array has these methods and '
                   f'attributes, each doing what the NumPy function of the same name does:</p>\n<p class="names">'
                   + ', '.join(f'<code>{html.escape(m)}</code>' for m in supported['method forms']) + '</p>')
    if refused:
        out.append(f'<h2 id="refused">Refused, with advice</h2>\n<p>These write into an array in place, which cannot be '
                   f'differentiated; on a traced value they raise a <code>DifferentiationError</code> that says what to '
                   f'use instead: ' + ', '.join(f'<code>{n}</code>' for n in refused) + '.</p>')
    out.append(f'<h2 id="nondifferentiable">Without a derivative</h2>\n<p>These {len(plain)} run on the plain values '
               f'and give results that are constants: comparisons, rounding, shapes, indices. Differentiating through '
               f'them gives no gradient, by design.</p>\n<p class="names">'
               + ', '.join(f'<code>{n}</code>' for n in plain) + '</p>\n'
               '<p>Any other NumPy function meets a traced value with a <code>NoDerivativeError</code> naming it.</p>')
    return '\n'.join(out)

# --- the benchmarks ----------------------------------------------------------------------------------------
BENCH = ROOT / 'bench'

def benchmarks():
    """HTML of bench/README.md, then the suite's latest results (bench/results.md, its headings one level down) with
    its chart (bench/results.png) after the main table, then any other markdown the benchmarks wrote; None if none."""
    parts = []
    if (BENCH / 'README.md').exists(): parts.append(markdown((BENCH / 'README.md').read_text(), anchor_link_text='#'))
    for p in sorted(p for p in BENCH.glob('*.md') if p.name != 'README.md'):
        text, chart = p.read_text(), p.with_suffix('.png')
        if chart.exists():                                               # the chart after the first table's notes
            img = f'\n![{p.stem}: the chart](bench-{chart.name})\n\n'
            at = text.find('\n## ', max(text.find('\n|'), 0))
            text = text + img if at < 0 else text[:at] + '\n' + img + text[at:]
        text = re.sub(r'^(#+ )', r'#\1', text, flags=re.M)              # one h1 to a page: the README's
        parts.append(markdown(text, anchor_link_text='#'))
    return '\n'.join(parts) or None

def bench_charts(out):
    "Copy the benchmarks' charts beside the pages (as bench-results.png), so the site stays one folder."
    for chart in BENCH.glob('*.png'):
        if chart.with_suffix('.md').exists(): shutil.copyfile(chart, out / f'bench-{chart.name}')

def link_course_table(body, stems):
    "In the index's tables, a cell's `01_matmul` (a notebook with a page) becomes a link to that page."
    def cell(m):
        return re.sub(r'(<a\b[^>]*>\s*)?<code>([\w.-]+?)(?:\.ipynb)?</code>', lambda c: (
            f'<a href="{page_name(c.group(2))}.html"><code>{c.group(2)}</code></a>'
            if c.group(2) in stems and not c.group(1) else c.group(0)), m.group(0))
    return re.sub(r'<table\b.*?</table>', lambda t: re.sub(r'<td\b.*?</td>', cell, t.group(0), flags=re.S), body, flags=re.S)

def contents_html(nav, pages):
    "The course's contents for the index page: each section's notebooks, in order, with their summaries."
    out = ['<h2 id="contents">Contents</h2>']
    for title, stems in nav:
        items = [s for s, _ in stems if s != 'index']
        if not items: continue
        if title: out.append(f'<h3>{html.escape(title)}</h3>')
        out.append('<ol class="contents">' + ''.join(
            f'<li><a href="{page_name(s)}.html">{html.escape(pages[s][0])}</a>{markdown(pages[s][1], exclude_anchor_links=True)}</li>'
            for s in items) + '</ol>')
    return '\n'.join(out)

# --- old names --------------------------------------------------------------------------------------------
RENAMED = {                                    # notebook stem before the course was reordered -> its stem now
    '05_checkpointing': '07_checkpointing', '05a_cnn_layers': '06_cnn_layers', '05b_classifier': '05_classifier',
    '05c_planner': '07c_planner', '05d_checkpointing_machinery': '07d_checkpointing_machinery',
    '06_coming_from': '11_coming_from', '07_scipy_in_the_loss': '12_scipy_in_the_loss',
    '08_coming_from': '11_coming_from', '09_scipy_in_the_loss': '12_scipy_in_the_loss'}

def redirect_html(target, title):
    "A page that sends the browser on to `target` at once (meta refresh), with a link for one that doesn't."
    t, title = html.escape(target), html.escape(title)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Moved: {title}</title>'
            f'<link rel="canonical" href="{t}"><meta http-equiv="refresh" content="0; url={t}"></head>\n'
            f'<body><p>This page moved to <a href="{t}">{title}</a>.</p></body></html>\n')

def redirects(out, pages, renamed=RENAMED):
    """For each renamed notebook, `old_stem.html` (and its old page name, where that differs from the new one)
    redirecting to the new page; a name that is a real page is left alone. Returns {written name: target}."""
    written, real = {}, {f'{page_name(s)}.html' for s in pages}
    for old, new in renamed.items():
        if new not in pages: problem(f"RENAMED sends {old} to {new}, which has no page"); continue
        target = f'{page_name(new)}.html'
        for name in dict.fromkeys([f'{old}.html', f'{page_name(old)}.html']):
            if name in real: continue
            (out / name).write_text(redirect_html(target, pages[new][0])); written[name] = target
    return written

# --- the site ----------------------------------------------------------------------------------------------
def build(out=ROOT / '_site'):
    "Write the whole site into `out`; return the pages written."
    del problems[:]
    warnings.filterwarnings('ignore', module='nbdev')               # nbdev's notes are about Quarto, not this build
    out = Path(out)
    if out.exists(): shutil.rmtree(out)
    out.mkdir(parents=True)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ASSETS), autoescape=False)
    env.filters['page'] = page_name
    page = env.get_template('page.html.j2')
    order = course_order()
    pages = {}                                                       # stem -> (title, summary, body)
    for _, stems in order:
        for stem in stems:
            if (NBS / f'{stem}.ipynb').exists(): pages[stem] = render_notebook(NBS / f'{stem}.ipynb')
            else: problem(f"nbs/sidebar.yml lists {stem}.ipynb, which does not exist")
    nav = [(title, [(stem, pages[stem][0]) for stem in stems if stem in pages]) for title, stems in order]
    course = [stem for _, stems in nav for stem, _ in stems]
    titles = {page_name(stem): t for stem, (t, _, _) in pages.items()}
    extra = {'api': ('API reference', api_reference(order, titles)), 'numpy': ('NumPy functions', numpy_table())}
    bench = benchmarks()
    if bench: extra['benchmarks'] = ('Benchmarks', bench)
    nav.append(('Reference', [(stem, title) for stem, (title, _) in extra.items()]))
    if 'index' in pages:                                            # the index: README's notebook, then the course
        title, summary, body = pages['index']
        pages['index'] = (title, summary, link_course_table(body, set(course)) + contents_html(nav[:-1], pages))
    written = []
    for stem in course + list(extra):
        title, body = (pages[stem][0], pages[stem][2]) if stem in pages else extra[stem]
        i = course.index(stem) if stem in course else None
        prev_, next_ = ((course[i - 1] if i else None), (course[i + 1] if i + 1 < len(course) else None)) if i is not None else (None, None)
        link = lambda s: s and {'href': f'{page_name(s)}.html', 'title': pages[s][0]}
        body = re.sub(r'<table\b.*?</table>', lambda m: f'<div class="table-wrap">{m.group(0)}</div>', body, flags=re.S)
        html_ = page.render(title=title, body=body, nav=nav, current=stem, prev=link(prev_), next=link(next_),
                            site_title='fastad')
        dest = out / f'{page_name(stem)}.html'
        dest.write_text(re.sub(r'href="([\w.-]+\.ipynb(#[^"]*)?)"', lambda m: f'href="{page_url(m.group(1))}"', html_))
        written.append(dest)
    redirects(out, pages)
    bench_charts(out)
    css = (ASSETS / 'site.css').read_text() + '\n/* code colours: pygments */\n' + HtmlFormatter(style='default').get_style_defs('.highlight')
    (out / 'site.css').write_text(css)
    return written

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', default=str(ROOT / '_site'), help="where to write the site (default: _site/)")
    args = ap.parse_args(argv)
    written = build(args.out)
    print(f"wrote {len(written)} pages to {args.out}; open {Path(args.out) / 'index.html'}"
          + (f" ({len(problems)} warnings)" if problems else ''))
    return 0

if __name__ == '__main__': sys.exit(main())
