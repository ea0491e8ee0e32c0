"""docker/: the compose stack and its image agree with the code they run.

Containers cannot run on the development machine, so this checks what can go stale without
Docker: every service's command is a valid `dagsched` invocation, every DAGSCHED_* variable
is a setting that validates, every endpoint names a service of the stack on a port it
serves, and the image copies what exists, with the Makefile's torch pin.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from dagsched.cli.main import run
from dagsched.settings import ENV_CONFIG_DIR, Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "compose.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"


def _stack() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _dagsched_services() -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in _stack()["services"].items()
        if svc.get("image", "").startswith("dagsched") and "entrypoint" not in svc
    }


def test_the_stack_has_every_part_design_names() -> None:
    services = _stack()["services"]
    assert {"kafka", "redis", "mlflow", "daemon", "learner", "evaluator", "replay"} <= set(services)
    assert services["daemon"]["deploy"]["replicas"] >= 2
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in str(services["kafka"]["environment"])  # KRaft
    assert not any("zookeeper" in name for name in services)
    for svc in _dagsched_services().values():
        assert set(svc["depends_on"]) == {"kafka", "redis", "mlflow"}
        assert all(d["condition"] == "service_healthy" for d in svc["depends_on"].values())
    for dep in ("kafka", "redis", "mlflow"):
        assert "healthcheck" in services[dep], dep


@pytest.mark.parametrize("name", sorted(_dagsched_services()))
def test_each_service_command_is_a_valid_dagsched_invocation(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    command = _dagsched_services()[name]["command"]
    assert run([*command, "--help"]) == 0, command
    assert "Usage" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(_dagsched_services()))
def test_each_service_environment_is_valid_settings(name: str) -> None:
    env = {k: str(v) for k, v in _dagsched_services()[name]["environment"].items()}
    for var in env:
        key = var.removeprefix("DAGSCHED_").lower()
        assert var.startswith("DAGSCHED_") and (
            key in Settings.model_fields or "__" in key or var == ENV_CONFIG_DIR
        ), f"{var} is not a setting"
    s = load_settings(environ={**env, ENV_CONFIG_DIR: str(REPO / "configs")})
    services = _stack()["services"]
    host, port = s.kafka_bootstrap.split(":")
    assert host in services and f"PLAINTEXT://{host}:{port}" in str(services[host]["environment"])
    redis = urlsplit(s.redis_url)
    assert redis.hostname in services and redis.port == 6379
    assert s.mlflow_tracking_uri is not None
    mlflow = urlsplit(s.mlflow_tracking_uri)
    assert mlflow.hostname in services
    entry = " ".join(services["mlflow"]["entrypoint"])
    assert f"--port={mlflow.port}" in entry
    assert f"{mlflow.hostname}:{mlflow.port}" in entry  # the Host header it is reached by


def test_the_image_copies_what_exists_with_the_pinned_torch() -> None:
    text = DOCKERFILE.read_text()
    sources = [
        src for line in text.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1]
    ]
    assert sources, "no COPY lines"
    for src in sources:
        assert (REPO / src).exists(), src
    pin = re.search(r"^TORCH\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert pin is not None
    assert f"pip install --index-url https://download.pytorch.org/whl/cpu {pin.group(1)}" in text
    # the entry point is the console script the project declares
    assert 'ENTRYPOINT ["dagsched"]' in text
    assert 'dagsched = "dagsched.cli.main:main"' in (REPO / "pyproject.toml").read_text()
