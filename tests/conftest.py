"""Shared fixtures: run a test under each array backend available here."""
import pytest
from fastad.backend import use_backend, gpu_available

BACKENDS = ["numpy", "strict"] + (["cupy"] if gpu_available() else [])

@pytest.fixture
def strict_backend():
    "The strict backend: arrays that refuse silent host copies, as on a GPU."
    with use_backend("strict") as xp: yield xp

@pytest.fixture(params=BACKENDS)
def any_backend(request):
    "Each backend in turn: numpy, strict, and cupy where a GPU is available."
    with use_backend(request.param) as xp: yield xp
