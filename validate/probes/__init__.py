"""What validate measures with: meta-device accounting (parameters, FLOPs, saved bytes),
timing and memory measurement, machine calibration, collective counting."""
