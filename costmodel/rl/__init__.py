"""One RL post-training step: rollouts (``costmodel.serve``), scoring and training
(``costmodel.estimate``), weight sync; ``python -m costmodel rl``."""

from costmodel.rl.step import PLACEMENTS, RLSpec, rl_step

__all__ = ["PLACEMENTS", "RLSpec", "rl_step"]
