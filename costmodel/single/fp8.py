"""fp8 training recipes: how a GEMM's fp8 operands are scaled (``TrainSpec.fp8_recipe``).

A recipe is the granularity of the scales an fp8 GEMM multiplies back in, and each one runs
its GEMMs at its own rate:

- ``tensorwise``: one scale per tensor (Transformer Engine's delayed and current scaling,
  torchao's ``Float8Linear`` default; Micikevicius et al. 2022, "FP8 Formats for Deep
  Learning", arXiv 2209.05433). The rate the profiles' ``efficiency.matmul_fp8`` states.
- ``rowwise``: one scale per row of the activations and per column of the weights
  (torchao's ``Float8LinearRecipeName.ROWWISE``, torchtitan's ``--float8.recipe_name
  rowwise``; cuBLASLt's outer-vector scaling): measured on a lent H100 SXM5 over the same 36
  shapes as tensorwise (``validate/measured/h100-sxm-gemms-2026-11-26``, torch
  ``_scaled_mm``), 0.954 of its rate at the median (0.925 at k = 768, 0.985 at 8,192;
  ``tests/test_fp8_recipes.py`` re-derives it). Applied on every device (no other measured).
- ``blockwise``: 1 x 128 tiles of the activations, 128 x 128 blocks of the weights
  (DeepSeek-V3 report, Sec. 3.3.2; Transformer Engine's ``Float8BlockScaling``,
  DeepGEMM). Not measured here: priced at the tensorwise rate, which the answers say.
- ``mxfp8``: one power-of-two (E8M0) scale per 32 consecutive values (OCP Microscaling
  Formats (MX) Specification v1.0; Transformer Engine's ``MXFP8BlockScaling``): the matrix
  cores of the generations with fp4 (Blackwell's ``tcgen05.mma`` with ``.kind::mxf8f6f4``;
  CDNA 4's scaled MFMA) take the block scales inside the MMA, so it runs only there; priced
  at the tensorwise rate (not measured here), as the answers say.

The scales themselves are a few bytes per 32-128 values (not counted: under 1 % of the fp8
operands they scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.specs.checks import SpecError


@dataclass(frozen=True)
class Fp8Recipe:
    """One fp8 scaling recipe: its scales in words, its GEMM rate and what runs it."""

    name: str
    scales: str
    gemm_rate: float
    """fp8 GEMM seconds at tensorwise scaling over this recipe's, on the same shape."""
    measured: bool
    """Whether ``gemm_rate`` is a measurement (else the tensorwise rate, assumed)."""
    block_scaled: bool = False
    """Needs matrix cores that apply block scales in the MMA (MX formats)."""


RECIPES: dict[str, Fp8Recipe] = {
    r.name: r
    for r in (
        Fp8Recipe("tensorwise", "one scale per tensor", 1.0, measured=True),
        Fp8Recipe("rowwise", "a scale per row and column", 0.954, measured=True),
        Fp8Recipe("blockwise", "1x128 and 128x128 blocks", 1.0, measured=False),
        Fp8Recipe("mxfp8", "an E8M0 scale per 32 values", 1.0, measured=False, block_scaled=True),
    )
}
"""Name -> recipe (``TrainSpec.fp8_recipe``)."""


def gemm_rate(recipe: Any) -> Any:
    """The recipe's fp8 GEMM rate over tensorwise scaling's (arrays of names too)."""
    names = np.asarray(recipe)
    rate: Any = 1.0
    for name in np.unique(names):
        rate = np.where(names == name, RECIPES[str(name)].gemm_rate, rate)
    return float(rate) if np.ndim(rate) == 0 else rate


def check_device(recipe: Any, precision: str, hardware: Any) -> None:
    """SpecError naming ``fp8_recipe`` where a block-scaled recipe meets a device whose
    matrix cores do not apply block scales (those without an fp4 peak)."""
    if precision != "fp8":
        return
    for name in np.unique(np.asarray(recipe)):
        if RECIPES[str(name)].block_scaled and "fp4" not in hardware.peak_flops:
            raise SpecError("fp8_recipe", f"fp8_recipe {name} needs matrix cores that apply "
                            "MX block scales in the MMA (Blackwell, CDNA 4: the devices with "
                            f"an fp4 peak); {hardware.name} has none: use tensorwise, "
                            "rowwise or blockwise")  # fmt: skip


def note(recipe: str) -> str:
    """The recipe in the assumptions line: its scales, and its rate where assumed."""
    r = RECIPES[recipe]
    assumed = "" if r.measured else "; GEMMs priced at tensorwise's rate, not measured"
    return f"{r.name} scaling ({r.scales}{assumed})"
