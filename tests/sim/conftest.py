"""Fixtures shared by the simulator's tests."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentflow.sim import host_profiles as hp


@pytest.fixture
def host_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
               ) -> Callable[[hp.HostIdentity], Path]:
    """An empty host-profile store that this process reads as if it ran on the given host.

    A test of host profiles must not read (or write) the user's real store, nor depend on
    which CPU the test machine has, nor inherit which mismatch warnings another test already
    printed; the store's path is returned so a test can read the file it wrote.
    """
    def on(host: hp.HostIdentity) -> Path:
        path = tmp_path / "host-profiles.json"
        monkeypatch.setenv(hp.ENV, str(path))
        monkeypatch.setattr(hp, "this_host", lambda: host)
        monkeypatch.setattr(hp, "_warned", set())
        return path
    return on
