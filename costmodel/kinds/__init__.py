"""Model kinds, one module each behind a small protocol (DESIGN.md, principle 9): the
attention cores (``costmodel.kinds.attention``)."""
