"""Serving a model: its KV cache, memory per device, prefill and decode time, throughput
(``terms``: the sympy terms; ``estimate``: the numbers). ``python -m costmodel serve``."""

from costmodel.serving.estimate import ServeEstimate, serve

__all__ = ["ServeEstimate", "serve"]
