"""The reference model (built from any ``costmodel.ModelSpec``), its norms and attention
kernels (naive, SDPA, compiled, tiled PyTorch and Triton FlashAttention-2)."""
