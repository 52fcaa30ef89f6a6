"""Training frameworks' pricing as plug-ins: one module each (``reference``, ``fsdp2``,
``megatron``, ``deepspeed``, ``handwritten``), each defining a :class:`Framework` and
exporting it as ``FRAMEWORK``. Adding one is its module plus its facts, a ``Traits`` entry
in :mod:`costmodel.specs.frameworks` (the choices the inputs offer, the rules, defaults)."""

from costmodel.frameworks.registry import Framework, framework_of

__all__ = ["Framework", "framework_of"]
