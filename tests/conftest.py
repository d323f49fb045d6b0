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
        # The CUDA tests first (each group in its collection order): the GPU check gives the whole
        # suite a few minutes of a rare GPU session, and the CPU-only tests (the host emulators'
        # and ptxas checks' compiles, most of the suite's time) are what CI runs anyway.
        items[:] = sorted(items, key=lambda item: "cuda" not in item.keywords)
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (or rudnn built without CUDA)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def jax_on_cpu():
    """JAX's default device set to the CPU for the test: where JAX has a GPU backend (the GPU
    check's machine), arrays and jit would otherwise run on the GPU, which tests that compare bits
    with rudnn's CPU backend, or test the cpu handlers' own behaviour, must not."""
    jax = pytest.importorskip("jax")
    with jax.default_device(jax.devices("cpu")[0]):
        yield
