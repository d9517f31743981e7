"""Where copies made before 2026-12-06 find what `common/stand_in.py` held: the NumPy copy of the
policy is now in `common.numpy_copy`, and the checks of the rollout in `common.rollout_checks`."""

from common.numpy_copy import numpy_copy
from common.rollout_checks import Acting, acts_otherwise_in_training, check_actions, check_replay

__all__ = ["Acting", "acts_otherwise_in_training", "check_actions", "check_replay", "numpy_copy"]
