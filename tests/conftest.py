"""Suite-wide settings.  ``FEDRISK_TEST_THREADS=N`` runs the whole suite with N torch threads
(the experiment tests default to one); together with CI's default thread count this catches
tests that compare floats beyond what the computation guarantees (results of reductions may
differ in the last bits between thread counts and CPUs)."""

from __future__ import annotations

import os

import pytest
import torch

THREADS = int(os.environ.get("FEDRISK_TEST_THREADS", "0"))


@pytest.fixture(autouse=True, scope="session")
def torch_threads():
    if THREADS > 0:
        torch.set_num_threads(THREADS)
    yield


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for the test (``FEDRISK_TEST_THREADS`` wins when set): many small
    tensor operations run fastest, and steadiest on a busy machine, on one thread.  Modules opt in
    with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS or 1)
    yield
    torch.set_num_threads(before)
