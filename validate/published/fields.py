"""The fields of a published run, read with their types checked.

A run is what its source states, in the schema of ``shared/published-runs/README.md``
(``id``, ``group``, ``source``, ``model``, ``hardware``, ``n_gpus``, ``parallelism``,
``micro_batch``, ``global_batch``, ``precision``, ``activation_recompute``,
``torch_compile``, ``measured``, ``notes``, ``uncertain``), plus the fields below, named
after the costmodel spec field each one sets. ``validate/published/data/*.json`` carry
them for every run, each value the source does not state cited in the run's
``assumptions``; a runs file without them gets the one generic default given here, and
the case's assumptions say so.

Needed (a run without one of these, or with a null, a string, a negative number or an
unknown device in its place, is not predicted: its report line names the run and the
field): ``id``; ``hardware`` (the device as its source writes it, resolved by
:func:`costmodel.catalog.hardware.resolve_device`); ``n_gpus``; ``global_batch``;
``model.seq`` and either ``model.preset`` (a costmodel preset) or ``model.vocab``,
``model.d_model``, ``model.n_layers``, ``model.n_heads``; and one measured rate:
``measured.tokens_per_s_per_gpu``, ``measured.tflops_per_gpu`` or ``measured.mfu``.

Optional, with their generic default:

- ``model.n_kv_heads``: ``model.n_heads`` (multi-head attention); ``model.d_ff``: 4 x
  ``model.d_model``; ``model.architecture``: ModelSpec keywords ``ffn``, ``norm``,
  ``bias``, ``tied``, ``pos``, each left out taking ModelSpec's default (the reference
  model: SwiGLU, RMSNorm, no biases, untied, RoPE).
- ``micro_batch``: 1 (sequences per micro-batch per data-parallel rank);
  ``parallelism.{dp,fsdp,tp,pp,cp,ep,vpp}``: 1 where null or absent (``dp`` is what
  ``n_gpus`` leaves; a stated one must agree). A TPU run's mesh:
  ``parallelism.{mx,my}`` (ICI torus axes its fsdp/dp and tp groups span) and
  ``parallelism.slices`` (slices joined over DCN), 1 where absent.
  ``parallelism.pp_split_embedding`` and ``parallelism.pp_split_loss``: the embedding and
  the loss counted as layers in the pipeline split (ParallelSpec's fields), false where
  absent. An expert-parallel run's ``parallelism.ep_dispatcher`` (``all-to-all``),
  ``parallelism.ep_routing`` (``random``: how the benchmark's router spreads a token's
  experts) and ``parallelism.ep_overlap`` (false): ParallelSpec's fields.
- ``framework`` (ParallelSpec.framework): ``fsdp2``. ``expert_gemm`` (ParallelSpec's: how
  the expert GEMMs launch): ``framework``. ``cuda_graphs`` (ParallelSpec's): ``none``.
  ``optimizer_impl``: ``foreach``.
  ``sequence_parallel``: true where tp > 1. ``async_tp`` and ``grad_reduce_fp32``: false.
- ``recompute`` (TrainSpec.recompute): the policy ``activation_recompute`` starts with
  (``full``, ``selective``), else ``none``; ``recompute_every`` (TrainSpec's): 1, every
  block. ``attention``: ``flash``.
  ``attention_kernel``: ``auto``. ``elementwise``: ``fused`` if ``torch_compile`` is
  true, else ``eager``. ``dropout``: 0. Precision: ``precision`` starting with ``fp8``
  is fp8, with ``fp16`` fp16-mixed, anything else bf16-mixed. ``fp8_recipe``
  (TrainSpec's: how an fp8 run scales its GEMM operands): ``tensorwise`` for an fp8 run,
  said in its assumptions (the profiles' fp8 rates are tensorwise scaling's); unused
  otherwise.
- ``network_gbps_per_node``: the inter-node line rate a source states per node, in Gb/s
  (in place of the catalog device's NICs); default: the catalog's.
- ``flops_convention``: the FLOPs per sequence a quoted ``tflops_per_gpu`` or ``mfu``
  counts: ``model`` (Megatron-Core's ``num_floating_point_operations``, no
  recomputation; the default), ``narayanan-2021`` (Narayanan et al. 2021, Sec. 5.1,
  which counts the recomputed forward) or PaLM's as MaxText counts (``palm``: 6·N·s +
  12·H·L·d_h·s²; ``palm-causal``: attention halved; ``six-n``: 6·N·s alone).
  ``mfu_peak_flops``: the FLOP/s a quoted ``mfu`` divides by; default: the device's
  dense bf16 (else fp16) peak in the catalog.
- ``assumptions``: what the data fills and where from, copied into the case.

Torch-free.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

DEFAULTS: dict[str, Any] = {
    "micro_batch": 1,
    "framework": "fsdp2",
    "optimizer_impl": "foreach",
    "async_tp": False,
    "grad_reduce_fp32": False,
    "attention": "flash",
    "attention_kernel": "auto",
    "dropout": 0.0,
    "flops_convention": "model",
}
"""The generic default of each optional field that has a constant one (the others are
derived from stated fields as the module docstring says)."""

MEASURED_RATES = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")


class CorpusError(ValueError):
    """A run that cannot be mapped: the message says which run, which field and why."""


class RunFields:
    """Typed reads of one run: a needed field that is missing or bad is a CorpusError
    naming the run and the field; an optional one left out takes its generic default,
    which is added to ``notes``."""

    def __init__(self, run: Any, notes: list[str]) -> None:
        if not isinstance(run, dict):
            raise CorpusError(f"{str(run)[:40]!r}: run: expected an object of fields")
        self.run, self.notes = run, notes
        rid, self.id = run.get("id"), "?"
        if not isinstance(rid, str) or not rid:
            self.fail("id", f"missing or not text (got {rid!r})")
        self.id = rid

    def fail(self, path: str, why: str) -> NoReturn:
        raise CorpusError(f"{self.id}: {path}: {why}")

    def raw(self, path: str) -> Any:
        """The value at a dotted path, None where absent."""
        value: Any = self.run
        keys = path.split(".")
        for i, key in enumerate(keys):
            if value is None:
                return None
            if not isinstance(value, dict):
                self.fail(".".join(keys[:i]), f"expected an object (got {value!r})")
            value = value.get(key)
        return value

    def has(self, path: str) -> bool:
        return self.raw(path) is not None

    def default(self, path: str, value: Any, why: str = "generic default") -> Any:
        shown = f"{value:g}" if isinstance(value, float) else value
        self.notes.append(f"{path} not stated: {shown} ({why})")
        return value

    def _absent(self, path: str, kind: str, default: Any, why: str = "generic default") -> Any:
        if default is not None:
            return self.default(path, default, why)
        if path in DEFAULTS:
            return self.default(path, DEFAULTS[path])
        self.fail(path, f"missing (needs {kind})")

    def count(self, path: str, default: int | None = None) -> int:
        """A positive integer (an integral float is taken as one)."""
        value = self.raw(path)
        if value is None:
            return self._absent(path, "a positive integer", default)
        integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not integral or value < 1:
            self.fail(path, f"expected a positive integer (got {value!r})")
        return int(value)

    def number(self, path: str, default: float | None = None, *, zero: bool = False) -> float:
        """A finite number > 0 (>= 0 with ``zero``)."""
        value = self.raw(path)
        if value is None:
            return self._absent(path, "a positive number", default)
        real = isinstance(value, int | float) and not isinstance(value, bool)
        if not real or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            self.fail(path, f"expected a {'' if zero else 'positive '}number (got {value!r})")
        return float(value)

    def flag(self, path: str, default: bool | None = None) -> bool:
        value = self.raw(path)
        if value is None:
            return self._absent(path, "true or false", default)
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false (got {value!r})")
        return value

    def text(self, path: str, default: str | None = None, why: str = "generic default") -> str:
        value = self.raw(path)
        if value is None:
            return self._absent(path, "text", default, why)
        if not isinstance(value, str):
            self.fail(path, f"expected text (got {value!r})")
        return value

    def choice(self, path: str, choices: tuple[str, ...]) -> str:
        value = self.text(path)
        if value not in choices:
            self.fail(path, f"expected one of {', '.join(choices)} (got {value!r})")
        return value

    def degree(self, name: str) -> int:
        """A parallelism degree: 1 where null or absent (not sharded that way)."""
        return self.count(f"parallelism.{name}") if self.has(f"parallelism.{name}") else 1

    def texts(self, path: str) -> list[str]:
        """A list of strings (one text is a list of one; empty where absent)."""
        value = self.raw(path)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(path, f"expected a list of text (got {value!r})")
        return list(value)
