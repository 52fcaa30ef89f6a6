"""Read a local Hugging Face ``config.json`` into a ModelSpec (llama, mistral, qwen2, gpt2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from costmodel.specs.model import ModelSpec

# Architectures whose every parameter the ModelSpec fields describe exactly.
_LLAMA_LIKE = {"llama", "mistral", "qwen2"}
_GPT2_ACT = {"gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
_GATED_ACT = {"silu": "swiglu", "swish": "swiglu"}


def _require(cfg: dict[str, Any], key: str, path: Path) -> Any:
    if key not in cfg:
        raise ValueError(f"{path}: config field {key!r} is missing")
    return cfg[key]


def _activation(cfg: dict[str, Any], key: str, table: dict[str, str], path: Path) -> str:
    act = cfg.get(key, next(iter(table)))
    if act not in table:
        raise ValueError(f"{path}: {key} must be one of {', '.join(table)} (got {act!r})")
    return table[act]


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Map HF field names onto ModelSpec; unsupported architectures are a clear error."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"hf-config: cannot read {path}: {err}") from err
    return model_from_hf_dict(cfg, path)


def model_from_hf_dict(cfg: Any, source: str | Path = "config.json") -> ModelSpec:
    """The same from an already parsed ``config.json`` (an upload); ``source`` names it."""
    path = Path(source)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a config.json must hold a JSON object")
    kind = cfg.get("model_type")
    if kind == "gpt2":
        d = _require(cfg, "n_embd", path)
        return ModelSpec(
            name=cfg.get("_name_or_path") or path.parent.name or "gpt2",
            vocab=_require(cfg, "vocab_size", path),
            d_model=d,
            n_layers=_require(cfg, "n_layer", path),
            n_heads=_require(cfg, "n_head", path),
            d_ff=cfg.get("n_inner") or 4 * d,
            ffn=_activation(cfg, "activation_function", _GPT2_ACT, path),
            norm="layernorm",
            bias=True,
            tied=cfg.get("tie_word_embeddings", True),
            pos="learned",
            max_positions=_require(cfg, "n_positions", path),
        )
    if kind in _LLAMA_LIKE:
        heads = _require(cfg, "num_attention_heads", path)
        return ModelSpec(
            name=cfg.get("_name_or_path") or path.parent.name or kind,
            vocab=_require(cfg, "vocab_size", path),
            d_model=_require(cfg, "hidden_size", path),
            n_layers=_require(cfg, "num_hidden_layers", path),
            n_heads=heads,
            n_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim"),
            d_ff=_require(cfg, "intermediate_size", path),
            ffn=_activation(cfg, "hidden_act", _GATED_ACT, path),
            norm="rmsnorm",
            qkv_bias=bool(cfg.get("attention_bias", False)) or kind == "qwen2",
            tied=bool(cfg.get("tie_word_embeddings", False)),
            pos="rope",
            max_positions=cfg.get("max_position_embeddings", 2048),
        )
    raise ValueError(
        f"{path}: model_type must be one of gpt2, {', '.join(sorted(_LLAMA_LIKE))} (got {kind!r})"
    )
