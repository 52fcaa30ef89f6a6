"""Training frameworks as plug-ins: one module each (``reference``, ``fsdp2``, ``megatron``,
``deepspeed``, ``handwritten``), each defining a :class:`Framework` and exporting it as
``FRAMEWORK``. Adding one is its module plus its name in
``costmodel.specs.parallel.Framework`` (the choices the inputs offer)."""

from costmodel.frameworks.registry import Framework, each, framework_of, trait

__all__ = ["Framework", "each", "framework_of", "trait"]
