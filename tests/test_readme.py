"""The README's commands are the ones CI runs: a new user who follows it literally runs what
CI proved, in a fresh virtual environment."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tests = [line for block in _bash_blocks(readme) for line in block.splitlines()
             if "-m pytest" in line]
    assert tests, "the README gives no test command"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests[0] in ci, f"{tests[0]!r} is not a line of .ci/run"


def test_ci_installs_into_a_fresh_venv_not_the_system_python() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.split(" #")[0] for line in ci.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert any("python3 -m venv" in c for c in commands)
    assert not any("--system-site-packages" in c for c in commands)
    after_venv = commands[next(i for i, c in enumerate(commands) if "activate" in c):]
    assert all("python3 " not in c for c in after_venv), "a command escapes the venv"


def test_the_readme_starts_with_a_venv() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = _bash_blocks(readme)[0]
    assert "python3 -m venv" in first


def test_the_readme_says_how_to_reach_real_accuracy_with_a_file_that_loads() -> None:
    """The first screen's next step: one command against an OpenAI-compatible endpoint, with
    a config file that is valid as shipped."""
    from agentflow.config import AgentFlowConfig
    from agentflow.llm import parse_backend_spec

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_screen = readme.split("## Five ways in")[0]
    command = next(line for block in _bash_blocks(first_screen) for line in block.splitlines()
                   if "--config" in line)
    path = command.split("--config ")[1].split()[0]
    config = AgentFlowConfig.load(ROOT / path)
    spec = parse_backend_spec(config.instances[0].backend)
    assert spec.type == "openai" and spec.base_url.endswith("/v1")  # type: ignore[attr-defined]
