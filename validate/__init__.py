"""Runs the real model and kernels and compares them with costmodel's predictions."""
