"""Your own cluster: calibrate its devices and network under ``torchrun``, then check a layout.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        -m validate.cluster calibrate --out DIR        # DIR/cluster-profile.json
    torchrun ... -m validate.cluster check --hardware DIR/cluster-profile.json --layout fsdp2

``calibrate`` (``validate.cluster.calibrate``) measures every rank's GEMMs, attention, memory
bandwidth and host overhead, the collectives and send/recv of every group placement (inside
a node, across nodes), and how much communication hides behind compute, and writes a
hardware profile that ``--hardware`` accepts everywhere. ``check``
(``validate.cluster.check``) runs real training steps of a layout and compares them with
``costmodel``'s prediction on that profile.
"""
