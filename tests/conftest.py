import pytest

try:
    import torch
except ImportError:  # torch is a test dependency; fail loudly in the tests that need it
    torch = None


def cuda_available() -> bool:
    import rudnn

    return bool(rudnn.has_cuda and torch is not None and torch.cuda.is_available())


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (or rudnn built without CUDA)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
