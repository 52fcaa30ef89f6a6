"""Shared fixtures; ``gpu`` tests skip cleanly without CUDA."""

from __future__ import annotations

import pytest

import validate.reference.attention  # noqa: F401  (sets TRITON_INTERPRET before triton loads)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
