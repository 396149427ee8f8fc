"""``agentflow serve --serve-config FILE``: a Ray Serve config (for ``serve deploy`` or a KubeRay
RayService's ``serveConfigV2``) whose application is ``agentflow.server.ray_serve:app_builder``.
The real CLI writes the file; the builder's arguments are read back into exactly what
``agentflow serve --ray ADDRESS --replicas N`` gives its replicas. Building the Serve
application itself needs ``ray[serve]`` and is skipped without it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import yaml

from agentflow.cli import apply_database_options
from agentflow.server.ray_serve import builder_inputs, replica_inputs
from agentflow.server.settings import load_serve_config
from agentflow.server.testing import scripted_instance
from tests.utils import ROOT

STATE = "postgresql://agentflow@db.example:5432/agentflow"


def write_config(tmp_path, **extra) -> str:
    config = {"fewshot": None, "pipeline": "chess", "slo_s": 60,
              "instances": [scripted_instance("cpu-0", latency_s=0.01)],
              "scheduler": {"shard_hosts": "ray", "shards": 2},
              "server": {"drain_s": 7, "lease_s": 5}, **extra}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentflow", "serve", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_serve_config_builds_the_replicas_serve_on_ray_would(tmp_path) -> None:
    path = write_config(tmp_path)
    out = tmp_path / "serve-config.yaml"
    done = cli("--config", path, "--state", STATE, "--replicas", "3", "--port", "8000",
               "--serve-config", str(out))
    assert done.returncode == 0, done.stderr
    serve = yaml.safe_load(out.read_text())
    assert serve["http_options"] == {"host": "0.0.0.0", "port": 8000}
    (app,) = serve["applications"]
    assert app["import_path"] == "agentflow.server.ray_serve:app_builder"
    assert app["route_prefix"] == "/" and app["args"]["replicas"] == 3
    config, settings = load_serve_config(path)
    apply_database_options(config, argparse.Namespace(data=[], engine=None))  # as serve does
    settings.state = STATE
    expected = replica_inputs(config, settings)
    got = builder_inputs(app["args"])
    assert got == (*expected, 3, 1.0)
    assert got[0]["scheduler"]["shard_shared"] is True  # one set of shard actors for all
    assert got[1]["state"] == STATE and got[1]["drain_s"] == 7
    # the same through stdout, and the builder also takes a path inside the image
    printed = cli("--config", path, "--state", STATE, "--replicas", "3", "--serve-config", "-")
    assert yaml.safe_load(printed.stdout) == serve
    from_path = builder_inputs({"config": path, "state": STATE, "replicas": 3})
    assert from_path == replica_inputs(*load_serve_config(path)[:1], settings) + (3, 1.0)


@pytest.mark.parametrize("extra, args, message", [
    ({}, ["--state", "off"], "must share a state store"),
    ({"placement": {"address": "auto"}}, ["--state", STATE], "placement"),
])
def test_a_deployment_serve_replicas_cannot_make_is_refused_here(tmp_path, extra, args,
                                                                 message) -> None:
    out = tmp_path / "serve-config.yaml"
    done = cli("--config", write_config(tmp_path, **extra), *args, "--replicas", "2",
               "--serve-config", str(out))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not out.exists()
    with pytest.raises(ValueError, match=message):
        builder_inputs({"config": write_config(tmp_path, **extra),
                        "state": None if "off" in args else STATE})


def test_the_builder_makes_a_serve_application(tmp_path) -> None:
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed "
                                            "(pip install 'agentflow[serve]')")
    from ray.serve import Application

    from agentflow.server.ray_serve import app_builder

    app = app_builder({"config": write_config(tmp_path), "state": STATE, "replicas": 2})
    assert isinstance(app, Application)
