"""fd.tape_of and fd.draw on everything fastad differentiates: the listing matches what the engine records and
what the pullback computes, drawing leaves gradients unchanged, and every entry gets a box and every parent an arrow;
in a notebook, IPython shows the picture."""
import numpy as np, pytest
from matplotlib.text import Annotation
import fastad as fd
from fastad.backend import to_device
from fastad.errors import DifferentiationError
import re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def boxes_and_arrows(fig):
    texts = fig.axes[0].texts
    return ([t for t in texts if t.get_bbox_patch() is not None], [t for t in texts if isinstance(t, Annotation)])

def check_drawing(f, *args):
    "Tape and drawing agree: one box per entry, one arrow per parent, shapes of the values that reach the output."
    tape = fd.tape_of(f, *args)
    boxes, arrows = boxes_and_arrows(fd.draw(f, *args))
    assert len(boxes) == len(tape) and len(arrows) == sum(len(e.parents) for e in tape)
    for e in tape:
        assert all(j < e.index for j in e.parents), "a parent comes before its child on the tape"
        assert f"%{e.index}" == boxes[e.index].get_text().split()[0]
    return tape

def test_listing_matches_the_engines_events_in_order():
    f = lambda x: np.tanh(x @ x.T).sum()
    x = np.random.default_rng(0).standard_normal((3, 4))
    with fd.trace_primitives() as log: fd.gradient(f, x)
    tape = check_drawing(f, x)
    forward = [name for phase, name in log.events if phase == 'forward']
    assert [e.op for e in tape.primitives] == forward
    assert [e.shape for e in tape] == [(3, 4), (4, 3), (3, 3), (3, 3), ()]

def test_shapes_of_a_model_and_labels_of_its_fields():
    layers = [fd.Dense(4, 3, activation=fd.relu, rng=fd.backend.default_rng(0)), fd.Dense(3, 1, rng=fd.backend.default_rng(1))]
    x = np.ones((5, 4), np.float32)
    def loss(layers): return fd.mse(fd.sequenced(x, through=layers).squeeze(-1), np.zeros(5, np.float32))
    tape = check_drawing(loss, layers)
    assert [e.label for e in tape if e.op == 'input'] == ['layers[0].weight', 'layers[0].bias', 'layers[1].weight', 'layers[1].bias']
    assert tape[tape.outputs[0]].shape == ()
    assert all(e.shape is not None for e in tape)           # every value here leads to the loss

def test_cnn_layers_and_custom_derivatives_draw():
    conv = fd.Conv2D((3, 3, 1, 2), rng=fd.backend.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, 6, 6, 1)).astype(np.float32)
    tape = check_drawing(lambda conv: fd.softmax_cross_entropy(fd.Flatten()(fd.MaxPool2D()(conv(x))), np.array([1, 3])), conv)
    assert 'conv2d' in [e.op for e in tape] and tape[tape.outputs[0]].shape == ()

def test_recomputed_pullbacks_and_nesting():
    g = fd.make_recomputed_in_gradient(lambda x: np.sin(x) * 2)
    check_drawing(lambda x: g(x).sum(), np.ones(3))
    nested = check_drawing(lambda x: x * fd.gradient(lambda y: x * y ** 2, 1.5), 3.0)
    assert fd.gradient(lambda x: x * fd.gradient(lambda y: x * y ** 2, 1.5), 3.0) == pytest.approx(2 * 3 * 3.0)
    assert len(nested.primitives) >= 2

def test_saved_bytes_count_what_the_chains_keep_beyond_the_inputs():
    x = np.ones(1000)
    assert fd.tape_of(lambda x: (x * x).sum(), x).saved_bytes == 0               # multiply keeps x itself: no new array
    assert fd.tape_of(lambda x: np.exp(x).sum(), x).saved_bytes == 8000           # exp keeps its result: 1000 float64s
    assert fd.tape_of(lambda x: (x + x).sum(), x).saved_bytes == 0                # add keeps nothing

def test_drawing_changes_no_gradient_and_leaves_nothing_traced():
    x = np.array([0.2, 0.5, 0.9])
    f = lambda x: (np.log(x) * np.exp(x)).mean()
    before = fd.gradient(f, x)
    fd.draw(f, x); fd.tape_of(f, x)
    np.testing.assert_array_equal(fd.gradient(f, x), before)

def test_an_unused_branch_and_a_constant_function():
    tape = fd.tape_of(lambda x: (np.exp(x), (x * 2).sum())[1], np.ones(2))
    assert tape[1].op == 'exp' and tape[1].shape is None and 'unused' in repr(tape)
    const = fd.tape_of(lambda x: 1.0, 2.0)
    assert const.outputs == [] and 'does not depend on the inputs' in repr(const)
    check_drawing(lambda x: 1.0, 2.0)

def test_errors_name_the_argument():
    with pytest.raises(DifferentiationError, match="argument 0 is an integer"): fd.tape_of(lambda n: n * 2.0, 3)

def test_on_each_backend(any_backend):
    x = to_device(np.array([1., 2., 3.]))
    tape = check_drawing(lambda x: (np.sin(x) * x).sum(), x)
    assert [e.shape for e in tape] == [(3,), (3,), (3,), ()]

def test_draw_without_matplotlib_names_the_extra(monkeypatch):
    "The lean install (pip install .) has no matplotlib: draw says which extra brings it, not a bare ModuleNotFoundError."
    import sys
    from fastad import drawing
    from fastad.errors import MissingExtraError
    drawing._picture.cache_clear()
    monkeypatch.setitem(sys.modules, 'matplotlib', None)
    monkeypatch.setitem(sys.modules, 'matplotlib.figure', None)
    try:
        with pytest.raises(MissingExtraError, match=r"fastad\[course\]"): fd.draw(lambda x: np.sin(x).sum(), np.ones(2))
    finally: drawing._picture.cache_clear()


# --- fd.draw shows its picture in a notebook -------------------------------------------------------------
def drawn():
    return fd.draw(lambda x, y: np.sin(x * y).sum(), np.ones(3), np.ones(3))

def test_draw_gives_ipython_a_png():
    from IPython.core.formatters import DisplayFormatter
    data, _ = DisplayFormatter().format(drawn())
    assert 'image/png' in data and data['image/png'][:8] == b'\x89PNG\r\n\x1a\n' and len(data['image/png']) > 5000

def test_lesson_03e_saves_the_picture_as_its_output():
    import json
    cells = json.loads((ROOT / 'nbs' / '03e_draw.ipynb').read_text())['cells']
    outputs = [o for c in cells if c['cell_type'] == 'code' and 'draw(' in ''.join(c['source'])
               and '#| export' not in ''.join(c['source']) for o in c['outputs']]
    assert any('image/png' in o.get('data', {}) for o in outputs), "re-execute nbs/03e_draw.ipynb"

@pytest.fixture(scope='session')
def site(tmp_path_factory):
    sys.path.insert(0, str(ROOT / 'tests'))
    from test_docs import build_site
    return build_site(tmp_path_factory)

def test_the_draw_page_of_the_docs_shows_an_image(site):
    page = (site / 'draw.html').read_text()
    assert re.search(r'<img[^>]+src="data:image/png;base64,', page), "no image on the draw page"
