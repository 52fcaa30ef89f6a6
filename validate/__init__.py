"""Run real code and compare it with costmodel's predictions.

Packages: ``reference`` (the model, norms, attention kernels), ``probes`` (meta-device
accounting, timing and memory measurement, calibration, collective counting),
``distributed`` (rank launcher, DDP variants, FSDP2/TP checks, collective benchmarks),
``suites`` (the cases ``python -m validate.run`` runs) and ``report`` (results, report and
charts; torch-free, the app's results page imports it). See docs/ARCHITECTURE.md.
"""
