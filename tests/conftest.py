"""Hypothesis profiles and the shape scale: tiny shapes under numba's CUDA simulator
(one OS thread per CUDA thread), larger ones on a real GPU.

Profiles: `ci` (derandomised, few examples: the simulator is slow), `dev` (more,
random), `gpu` (many, random, large shapes). Choose with NBDNN_HYPOTHESIS_PROFILE;
default: `gpu` on hardware, `ci` otherwise."""
import os

import pytest
from hypothesis import HealthCheck, settings

from nbdnn.cuda import SIMULATOR

_common = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("ci", max_examples=3, derandomize=True, **_common)
settings.register_profile("dev", max_examples=10, **_common)
settings.register_profile("gpu", max_examples=25, **_common)
settings.load_profile(os.environ.get("NBDNN_HYPOTHESIS_PROFILE", "ci" if SIMULATOR else "gpu"))

BIG = not SIMULATOR


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs real CUDA hardware (skipped in the simulator)")


def _ptx_module(session):
    return next((item.module for item in session.items
                 if item.path.name == "test_ptx.py"), None)


def pytest_collection_finish(session):
    """Start the PTX test's compile processes now: they run beside the other tests."""
    m = _ptx_module(session)
    if m is not None and not session.config.option.collectonly:
        m.start()


def pytest_sessionfinish(session):
    m = _ptx_module(session)
    if m is not None:
        m.stop()


def pytest_collection_modifyitems(config, items):
    # the PTX test last: it waits for its compile processes, which run (at a lower
    # priority) beside every other test instead of holding the rest back
    items.sort(key=lambda item: item.path.name == "test_ptx.py")
    if SIMULATOR:
        skip = pytest.mark.skip(reason="needs a real GPU (numba's simulator is active)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Each test starts without eager call plans (nbdnn/ops/_plan.py): a test that
    steers dispatch (monkeypatched limits, forced variants) must not replay a plan
    learned by an earlier test."""
    from nbdnn.ops import _plan
    _plan.clear()
    yield


@pytest.fixture(autouse=True)
def _torch_tf32_flags():
    """PyTorch's TF32 permissions (which nbdnn.torch follows) as they were before each
    test: a test that turns them off for an exact check leaves the next its defaults."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags
