"""Image versions of the probes: the cue is which half of a 36x36 image is lit (the left half for 0, the right half
for 1), so an agent must read it through its CNN. 36x36 is the Nature CNN's smallest input, which keeps CI fast.

- ``ImageBandit-v0`` / ``ImageBanditRGB-v0``: Probe5 (one step, reward +1 for the action equal to the cue, else -1).
- ``ImageMemory-v0`` / ``ImageMemoryRGB-v0``: Probe7 (the cue in the first frame only, then blank frames; +1 at the
  fourth step for the action equal to the cue).
- ``ImageVectorBandit-v0``: a Dict observation of an image and a vector part, both needed: the right action is the
  lit half, flipped where the Discrete part ``flip`` is 1.

The plain ids are channels first, (1, 36, 36); the RGB ids are channels last, (36, 36, 3), as rendered frames are.
Values and optimal actions are the vector probes' (their docstrings state them)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from probe_envs.probes import Probe5, Probe7

SIDE = 36


class ImageProbe:
    """A probe whose observation is an image of its cue (`_image`), channels first or last."""

    channels_last = False

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode)
        shape = (SIDE, SIDE, 3) if self.channels_last else (1, SIDE, SIDE)
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)

    def _image(self, lit_half: int | None) -> np.ndarray:
        """A black image with its left (0) or right (1) half white; all black for None."""
        image = np.zeros((SIDE, SIDE), dtype=np.uint8)
        if lit_half is not None:
            image[:, lit_half * SIDE // 2 : (lit_half + 1) * SIDE // 2] = 255
        return np.repeat(image[..., None], 3, axis=-1) if self.channels_last else image[None]


class ImageBandit(ImageProbe, Probe5):
    """Probe5 with the cue shown as an image: action = the lit half (0 left, 1 right); V* = 1."""

    def _observation(self):
        return self._image(self.cue)


class ImageBanditRGB(ImageBandit):
    """ImageBandit with channels last, (36, 36, 3)."""

    channels_last = True


class ImageMemory(ImageProbe, Probe7):
    """Probe7 with the cue shown as an image in the first frame only, then black frames: at the fourth step, action =
    the half lit at the first. V(t) = gamma^(3 - t) with memory; at most half of it without."""

    def _observation(self):
        return self._image(self.cue if self.t == 0 else None)


class ImageMemoryRGB(ImageMemory):
    """ImageMemory with channels last, (36, 36, 3)."""

    channels_last = True


class ImageVectorBandit(ImageBanditRGB):
    """A Dict observation, {"flip": Discrete(2), "pixels": the cue's image, channels last}: one step, reward +1 for the
    action equal to the lit half XOR flip, else -1. Breaks: a network that reads only the image, or only the vector
    (either alone earns 0 on average); V* = 1."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode)
        self.observation_space = spaces.Dict(
            {"flip": spaces.Discrete(2), "pixels": self.observation_space}
        )
        self.flip = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        self.flip = int(self.np_random.integers(2))
        return self._observation(), {}

    def _observation(self):
        return {"flip": self.flip, "pixels": self._image(self.cue)}

    def _reward(self, action):
        return 1.0 if int(action) == self.optimal_action() else -1.0

    def optimal_action(self):
        return self.cue ^ self.flip
