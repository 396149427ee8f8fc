"""calibrate warns when the speed probe's runs disagree: the machine's speed moved."""
from __future__ import annotations

import pytest

from agentflow.sim.host_calibration import probe_spread_warning


def test_quiet_calibration_gives_no_warning():
    # the lead's idle calibration at 01:03: 4.236-4.321 CPU-s
    assert probe_spread_warning([4.321, 4.307, 4.236, 4.236]) is None
    assert probe_spread_warning([5.0]) is None
    assert probe_spread_warning([]) is None


def test_moving_machine_is_named_with_its_range():
    # the 22:46 calibration: 4.710-6.070 CPU-s (the replays after it 1.29-1.41x the CPU)
    text = probe_spread_warning([5.082, 6.070, 4.946, 4.710])
    assert text is not None
    assert "29%" in text and "4.710-6.070" in text


def test_limit_is_a_ratio_and_bad_input_is_refused():
    assert probe_spread_warning([1.0, 1.09]) is None
    assert probe_spread_warning([1.0, 1.11]) is not None
    assert probe_spread_warning([1.0, 1.05], limit=1.02) is not None
    with pytest.raises(ValueError, match="positive"):
        probe_spread_warning([0.0, 1.0])
