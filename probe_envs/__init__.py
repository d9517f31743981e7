"""Small gymnasium environments that each pin down one way an agent can be broken.

Importing this package registers the ids below with gymnasium:

- ``Probe1-v0`` ... ``Probe7-v0``: Andy Jones' probes (1-5), a longer-horizon observation-following probe (6) and a
  memory probe (7); discrete actions.
- ``RepeatCue-v0``: a memory-length probe, a cue needed up to 127 steps after it was shown.
- ``ContinuousProbe1-v0`` ... ``ContinuousProbe5-v0``: the same ideas with a Box(-1, 1, (1,)) action.
- ``MultiDiscreteProbe-v0``: probe 5 with a MultiDiscrete([2, 3]) action, each part from the observation.
- ``CartPoleNoVel-v1``, ``PendulumNoVel-v1``: classic control with velocities hidden (partially observed).
- ``ImageBandit-v0``, ``ImageMemory-v0`` and their channels-last ``...RGB-v0`` forms: probes 5 and 7 seen as images;
  ``ImageVectorBandit-v0``: a Dict of an image and a vector, both needed (``probe_envs.images``).

Each class docstring states the optimal policy and the true values for any discount.
"""

from gymnasium.envs.registration import register, registry

from probe_envs.images import (
    ImageBandit,
    ImageBanditRGB,
    ImageMemory,
    ImageMemoryRGB,
    ImageVectorBandit,
)
from probe_envs.no_velocity import CartPoleNoVelEnv, PendulumNoVelEnv
from probe_envs.probes import (
    ContinuousProbe1,
    ContinuousProbe2,
    ContinuousProbe3,
    ContinuousProbe4,
    ContinuousProbe5,
    MultiDiscreteProbe,
    Probe1,
    Probe2,
    Probe3,
    Probe4,
    Probe5,
    Probe6,
    Probe7,
    ProbeEnv,
    RepeatCue,
)

PROBES = {
    "Probe1-v0": Probe1,
    "Probe2-v0": Probe2,
    "Probe3-v0": Probe3,
    "Probe4-v0": Probe4,
    "Probe5-v0": Probe5,
    "Probe6-v0": Probe6,
    "Probe7-v0": Probe7,
    "RepeatCue-v0": RepeatCue,
    "ContinuousProbe1-v0": ContinuousProbe1,
    "ContinuousProbe2-v0": ContinuousProbe2,
    "ContinuousProbe3-v0": ContinuousProbe3,
    "ContinuousProbe4-v0": ContinuousProbe4,
    "ContinuousProbe5-v0": ContinuousProbe5,
    "MultiDiscreteProbe-v0": MultiDiscreteProbe,
    "ImageBandit-v0": ImageBandit,
    "ImageBanditRGB-v0": ImageBanditRGB,
    "ImageMemory-v0": ImageMemory,
    "ImageMemoryRGB-v0": ImageMemoryRGB,
    "ImageVectorBandit-v0": ImageVectorBandit,
}
"""Every probe id and its class."""

PARTIALLY_OBSERVED = {
    "CartPoleNoVel-v1": (CartPoleNoVelEnv, 500, 475.0),
    "PendulumNoVel-v1": (PendulumNoVelEnv, 200, None),
}
"""Partially observed ids: class, episode step limit, reward threshold."""

# Probes always terminate at their horizon, so they get no TimeLimit. Registering twice (a re-import under another
# name, a reload) would only warn; skip ids that already exist.
for _env_id, _cls in PROBES.items():
    if _env_id not in registry:
        register(id=_env_id, entry_point=_cls)
for _env_id, (_cls, _steps, _threshold) in PARTIALLY_OBSERVED.items():
    if _env_id not in registry:
        register(
            id=_env_id, entry_point=_cls, max_episode_steps=_steps, reward_threshold=_threshold
        )

__all__ = [
    "PARTIALLY_OBSERVED",
    "PROBES",
    "CartPoleNoVelEnv",
    "ContinuousProbe1",
    "ContinuousProbe2",
    "ContinuousProbe3",
    "ContinuousProbe4",
    "ContinuousProbe5",
    "ImageBandit",
    "ImageBanditRGB",
    "ImageMemory",
    "ImageMemoryRGB",
    "ImageVectorBandit",
    "MultiDiscreteProbe",
    "PendulumNoVelEnv",
    "Probe1",
    "Probe2",
    "Probe3",
    "Probe4",
    "Probe5",
    "Probe6",
    "Probe7",
    "ProbeEnv",
    "RepeatCue",
]
