"""Distributed code: the rank launcher, hand-written DDP variants and ZeRO-1, FSDP2 and
DTensor TP checks, collective benchmarks, and the torchrun entry point."""
