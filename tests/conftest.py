import os

import pytest
from hypothesis import settings

# CI machines are noisy: a property test must fail on a wrong answer, never on a slow example.
settings.register_profile("default", deadline=None)
settings.load_profile("default")

# Headless machines: pygame (classic-control rendering) must not look for a display or audio device.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
# pytest -n 2 runs two workers on the two cores: one thread each, also where a network's default is every core.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch):
    """Each test sees every notice its code prints: `common.cli.notice` prints a message once per process."""
    monkeypatch.setattr("common.cli._printed_notices", set())
