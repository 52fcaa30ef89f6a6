"""Read a local Hugging Face ``config.json`` into a ModelSpec (llama, mistral, qwen2, qwen3,
gpt2, gemma2, gemma3 (its text decoder); mixtral, deepseek, deepseek_v2, deepseek_v3,
qwen2_moe, qwen3_moe and gpt_oss mixtures of experts), sliding windows included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from costmodel.catalog.files import parse_json, read_bytes
from costmodel.specs.checks import SpecError
from costmodel.specs.model import ModelSpec

# Architectures whose every parameter the ModelSpec fields describe exactly.
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3"}
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3_text"}  # RMSNorm over each head's query and key
_GEMMA = {"gemma2", "gemma3_text"}  # GeGLU costed as the 3-matrix gated FFN, tied
_GPT2_ACT = {"gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
_GATED_ACT = {"silu": "swiglu", "swish": "swiglu"}
_GEGLU_ACT = {"gelu_pytorch_tanh": "swiglu", "gelu": "swiglu"}  # Gemma's gated GELU


"""A config.json is a few KB; anything over 16 MiB is not one (and /dev/zero never ends)."""
_MOE_KINDS = ("mixtral", "deepseek", "deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe",
              "gpt_oss")  # fmt: skip
"""Mixture-of-experts architectures whose every parameter the ModelSpec fields describe."""
_LATENT = ("deepseek_v2", "deepseek_v3")  # multi-head latent attention
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
             "moe_intermediate_size")  # fmt: skip


def _text(cfg: dict[str, Any], key: str, default: str, path: Path) -> str:
    value = cfg.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{path}: {key} must be a string (got {value!r})")
    return value


def _flag(cfg: dict[str, Any], key: str, default: bool, path: Path) -> bool:
    """A JSON true/false; a string such as "false" is an error, not truthy."""
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{path}: {key} must be true or false (got {value!r})")
    return value


_REQUIRED = object()


def _count(cfg: dict[str, Any], key: str, path: Path, default: Any = _REQUIRED) -> Any:
    """A positive integer field; ``default`` when absent or null (required without one)."""
    value = cfg.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"{path}: config field {key!r} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: {key} must be an integer >= 1 (got {value!r})")
    return value


def _activation(cfg: dict[str, Any], key: str, table: dict[str, str], path: Path) -> str:
    act = _text(cfg, key, next(iter(table)), path)
    if act not in table:
        raise ValueError(f"{path}: {key} must be one of {', '.join(table)} (got {act!r})")
    return table[act]


def parse_config(data: bytes, source: str | Path = "config.json") -> Any:
    """JSON from bytes (a file's or an upload's), with one clear sentence for what a
    parser can raise (:func:`costmodel.catalog.files.parse_json`)."""
    return parse_json(data, source, "hf_config")


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Map HF field names onto ModelSpec; unsupported architectures are a clear error."""
    path = Path(path)
    return model_from_hf_dict(parse_config(read_bytes(path, "hf_config"), path), path)


def model_from_hf_dict(cfg: Any, source: str | Path = "config.json") -> ModelSpec:
    """The same from an already parsed ``config.json`` (an upload); ``source`` names it.
    A config the mapping cannot read is a SpecError naming ``hf_config`` and the file."""
    try:
        return _from_dict(cfg, Path(source))
    except SpecError:
        raise
    except ValueError as err:
        raise SpecError("hf_config", f"hf_config: {err}") from None


def _from_dict(cfg: Any, path: Path) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a config.json must hold a JSON object")
    kind = cfg.get("model_type")
    if not isinstance(kind, str):
        raise ValueError(f"{path}: model_type must be a string (got {kind!r})")
    moe = [k for k in _MOE_KEYS if cfg.get(k)]
    if moe and kind not in _MOE_KINDS:
        raise ValueError(f"{path}: mixture-of-experts model_type {kind!r} is not modelled "
                         f"({moe[0]}={cfg[moe[0]]!r}); supported: {', '.join(_MOE_KINDS)}. "
                         "Costing it as a dense model would undercount its parameters")  # fmt: skip
    # the checkpoint's own name, else the file's (llama31.json) unless it is config.json,
    # whose folder then names it (a downloaded model's folder)
    stem = path.stem if path.stem not in ("config", "") else ""
    name = cfg.get("_name_or_path") or stem or path.parent.name or kind
    if kind == "gemma3":  # the multimodal wrapper: its text decoder (no vision encoder)
        cfg, kind = cfg.get("text_config"), "gemma3_text"
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: a gemma3 config needs a text_config object")
    if not isinstance(name, str):
        raise ValueError(f"{path}: _name_or_path must be a string (got {name!r})")
    if kind == "gpt2":
        d = _count(cfg, "n_embd", path)
        return ModelSpec(
            name=name,
            vocab=_count(cfg, "vocab_size", path),
            d_model=d,
            n_layers=_count(cfg, "n_layer", path),
            n_heads=_count(cfg, "n_head", path),
            d_ff=_count(cfg, "n_inner", path, default=4 * d),
            ffn=_activation(cfg, "activation_function", _GPT2_ACT, path),
            norm="layernorm",
            bias=True,
            tied=_flag(cfg, "tie_word_embeddings", True, path),
            pos="learned",
            max_positions=_count(cfg, "n_positions", path),
        )
    if kind in _LLAMA_LIKE or kind in _MOE_KINDS or kind in _GEMMA:
        fields = {**_llama_like(cfg, kind, path), **_experts(cfg, kind, path)}
        if kind in _LATENT:
            fields.update(_latent(cfg, path))
        fields.update(_window(cfg, kind, fields["n_layers"], path))
        return ModelSpec(name=name, **fields)
    kinds = ", ".join(sorted({*_LLAMA_LIKE, *_MOE_KINDS, *_GEMMA, "gemma3"}))
    raise ValueError(f"{path}: model_type must be one of gpt2, {kinds} (got {kind!r})")


def _llama_like(cfg: dict[str, Any], kind: str, path: Path) -> dict[str, Any]:
    """Pre-norm RMSNorm, RoPE, gated FFN decoders (Llama and what shares its blocks)."""
    heads = _count(cfg, "num_attention_heads", path)
    return {
        "vocab": _count(cfg, "vocab_size", path),
        "d_model": _count(cfg, "hidden_size", path),
        "n_layers": _count(cfg, "num_hidden_layers", path),
        "n_heads": heads,
        "n_kv_heads": _count(cfg, "num_key_value_heads", path, default=heads),
        "head_dim": _count(cfg, "head_dim", path, default=None),
        "d_ff": _count(cfg, "intermediate_size", path),
        "ffn": _ffn(cfg, kind, path),
        "norm": "rmsnorm",
        "qkv_bias": _flag(cfg, "attention_bias", False, path) or kind in ("qwen2", "qwen2_moe"),
        "qk_norm": kind in _QK_NORM,
        "tied": _flag(cfg, "tie_word_embeddings", kind in _GEMMA, path),
        "pos": "rope",
        "max_positions": _count(cfg, "max_position_embeddings", path, default=2048),
    }


def _groups(cfg: dict[str, Any], path: Path) -> dict[str, int]:
    """DeepSeek-V2/V3's group-limited routing: ``n_group`` groups, a token's experts from
    ``topk_group`` of them; {} where one group or every group may be taken (no limit)."""
    groups = _count(cfg, "n_group", path, default=1)
    chosen = _count(cfg, "topk_group", path, default=groups)
    if groups <= 1 or chosen >= groups:
        return {}
    return {"expert_groups": groups, "groups_per_token": chosen}


def _experts(cfg: dict[str, Any], kind: str, path: Path) -> dict[str, Any]:
    """Mixtral (every FFN E experts of width intermediate_size; Jiang et al. 2024) and
    DeepSeekMoE (routed and shared experts of width moe_intermediate_size after
    first_k_dense_replace dense blocks; Dai et al. 2024); {} for a dense model."""
    if kind == "mixtral":
        return {"n_experts": _count(cfg, "num_local_experts", path),
                "experts_per_token": _count(cfg, "num_experts_per_tok", path),
                "d_ff_expert": _count(cfg, "intermediate_size", path)}  # fmt: skip
    if kind in ("qwen2_moe", "qwen3_moe"):
        return _qwen_moe(cfg, kind, path)
    if kind == "gpt_oss":
        return _gpt_oss(cfg, path)
    if kind not in ("deepseek", *_LATENT):
        return {}
    if _count(cfg, "moe_layer_freq", path, default=1) != 1:
        raise ValueError(
            f"{path}: moe_layer_freq must be 1 (every block after the dense ones "
            "is an MoE block); interleaved dense blocks are not modelled"
        )
    return {"n_experts": _count(cfg, "n_routed_experts", path),
            "experts_per_token": _count(cfg, "num_experts_per_tok", path),
            "d_ff_expert": _count(cfg, "moe_intermediate_size", path),
            "n_shared_experts": _none_or_more(cfg, "n_shared_experts", path),
            "dense_layers": _none_or_more(cfg, "first_k_dense_replace", path),
            **_groups(cfg, path),
            # renormalised top-k: DeepSeekMoE always; V2 and V3 where norm_topk_prob says
            "moe_renormalize": kind == "deepseek" or _flag(
                cfg, "norm_topk_prob", kind == "deepseek_v3", path)}  # fmt: skip


def _gpt_oss(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """gpt-oss (OpenAI 2025, model card): every block's FFN num_local_experts SwiGLU experts
    of width intermediate_size, top num_experts_per_tok, with biases on every expert matrix
    and attention projection (``bias``, which implies the q, k, v ones); its router's bias
    and attention sinks are not counted."""
    if not _flag(cfg, "attention_bias", True, path):
        raise ValueError(f"{path}: attention_bias must be true for gpt_oss (the experts' "
                         "biases are costed with the attention's, as bias)")  # fmt: skip
    return {"n_experts": _count(cfg, "num_local_experts", path),
            "experts_per_token": _count(cfg, "num_experts_per_tok", path),
            "d_ff_expert": _count(cfg, "intermediate_size", path),
            "bias": True, "qkv_bias": False}  # fmt: skip


def _ffn(cfg: dict[str, Any], kind: str, path: Path) -> str:
    """The gated FFN: SwiGLU, or Gemma's GeGLU (hidden_activation), costed alike."""
    if kind in _GEMMA and "hidden_activation" in cfg:
        return _activation(cfg, "hidden_activation", _GEGLU_ACT, path)
    return _activation(cfg, "hidden_act", _GEGLU_ACT if kind in _GEMMA else _GATED_ACT, path)


def _window(cfg: dict[str, Any], kind: str, layers: int, path: Path) -> dict[str, int]:
    """Sliding-window attention: ``sliding_window`` (ignored where ``use_sliding_window`` is
    false, as Qwen2 configs set), on the layers ``layer_types`` names sliding, else on every
    layer but each ``sliding_window_pattern``-th (Gemma 3) or each second (Gemma 2), else on
    every layer (Mistral-7B v0.1); Qwen's first ``max_window_layers`` without a window."""
    if not _flag(cfg, "use_sliding_window", not kind.startswith("qwen"), path):
        return {}  # Qwen's configs carry a sliding_window they do not use by default
    window = _none_or_more(cfg, "sliding_window", path)
    if cfg.get("layer_types") is not None:
        every = _global_every(cfg["layer_types"], layers, path)
        if every is not None and not window:
            raise ValueError(f"{path}: sliding_window must be an integer >= 1 where "
                             "layer_types names sliding_attention layers")  # fmt: skip
    elif not window:
        return {}
    elif kind == "gemma2":
        every = 2
    elif kind.startswith("qwen") and cfg.get("max_window_layers", 0):
        if _count(cfg, "max_window_layers", path) < layers:
            raise ValueError(f"{path}: max_window_layers must be 0 or >= num_hidden_layers: "
                             "a window on the last layers only is not modelled")  # fmt: skip
        every = None
    else:
        every = _none_or_more(cfg, "sliding_window_pattern", path)
    return {} if every is None else {"sliding_window": window, "global_every": every}


def _global_every(types: Any, layers: int, path: Path) -> int | None:
    """``global_every`` of a ``layer_types`` list: 0 where every layer slides, n where
    every n-th layer is full attention and the others slide; None where none slides."""
    kinds = ("sliding_attention", "full_attention")
    if not isinstance(types, list) or len(types) != layers or any(t not in kinds for t in types):
        raise ValueError(f"{path}: layer_types must name {' or '.join(kinds)} for each of "
                         f"the {layers} layers")  # fmt: skip
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if not full or len(full) == layers:
        return None if full else 0
    every = full[0] + 1
    if full != list(range(every - 1, layers, every)):
        raise ValueError(f"{path}: layer_types must make every n-th layer full_attention and "
                         f"the others sliding_attention (got full_attention at {full}); other "
                         "patterns are not modelled")  # fmt: skip
    return every


def _latent(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """DeepSeek-V2/V3's multi-head latent attention (DeepSeek-V2, Sec. 2.1): head_dim is
    qk_nope_head_dim; q_lora_rank null is a full-rank query. DeepSeek-V3's router scores
    with a sigmoid over group-limited top-k (its Sec. 2.1.2); costmodel's router is a
    softmax top-k of the same parameters and FLOPs, its per-token bytes a few scalars
    apart. Its multi-token-prediction module (num_nextn_predict_layers) is not counted."""
    return {"kv_lora_rank": _count(cfg, "kv_lora_rank", path),
            "q_lora_rank": _none_or_more(cfg, "q_lora_rank", path),
            "rope_head_dim": _count(cfg, "qk_rope_head_dim", path),
            "head_dim": _count(cfg, "qk_nope_head_dim", path),
            "v_head_dim": _count(cfg, "v_head_dim", path)}  # fmt: skip


def _qwen_moe(cfg: dict[str, Any], kind: str, path: Path) -> dict[str, Any]:
    """Qwen-MoE: every block's FFN num_experts experts of width moe_intermediate_size, the
    top-k weights renormalised where norm_topk_prob says (false by default, as the HF
    config classes); Qwen2-MoE adds shared experts of shared_expert_intermediate_size,
    scaled by a sigmoid gate (Qwen Team 2024, "Qwen1.5-MoE"; Qwen3 Technical Report, Sec. 2:
    Qwen3-MoE has none)."""
    if _count(cfg, "decoder_sparse_step", path, default=1) != 1 or cfg.get("mlp_only_layers"):
        raise ValueError(f"{path}: every block must be an MoE block (decoder_sparse_step 1, "
                         "no mlp_only_layers); dense ones between are not modelled")  # fmt: skip
    width = _count(cfg, "moe_intermediate_size", path)
    out = {"n_experts": _count(cfg, "num_experts", path),
           "experts_per_token": _count(cfg, "num_experts_per_tok", path),
           "d_ff_expert": width,
           "moe_renormalize": _flag(cfg, "norm_topk_prob", False, path)}  # fmt: skip
    if kind == "qwen2_moe":
        shared = _none_or_more(cfg, "shared_expert_intermediate_size", path)
        if shared % width:
            raise ValueError(f"{path}: shared_expert_intermediate_size ({shared}) must be a "
                             f"multiple of moe_intermediate_size ({width}): the shared "
                             "experts are costed as whole experts")  # fmt: skip
        out.update(n_shared_experts=shared // width, shared_expert_gate=shared > 0)
    return out


def _none_or_more(cfg: dict[str, Any], key: str, path: Path) -> int:
    """An integer >= 0 field, 0 when absent or null."""
    value = cfg.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: {key} must be an integer >= 0 (got {cfg.get(key)!r})")
    return value
