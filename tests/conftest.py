import os

import pytest
from hypothesis import settings

# CI machines are noisy: a property test must fail on a wrong answer, never on a slow example.
settings.register_profile("default", deadline=None)
settings.load_profile("default")

# Headless machines: pygame (classic-control rendering) must not look for a display or audio device.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch):
    """Each test sees every notice its code prints: `common.cli.notice` prints a message once per process."""
    monkeypatch.setattr("common.cli._printed_notices", set())
