"""Run real code and compare it with costmodel's predictions (torch).

Without CUDA, Triton kernels run in Triton's interpreter. Triton decides that when its
language module is imported, so the switch is set here, before any submodule (or torch,
on their behalf) imports triton.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
