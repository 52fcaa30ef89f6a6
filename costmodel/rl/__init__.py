"""One RL post-training step: rollouts (``costmodel.rl.rollout`` over ``costmodel.serving``),
scoring and training (``costmodel.estimate``), weight sync; ``python -m costmodel rl``."""

from costmodel.rl.spec import PLACEMENTS, RLSpec
from costmodel.rl.step import rl_step

__all__ = ["PLACEMENTS", "RLSpec", "rl_step"]
