"""docker-compose.yml and the Dockerfiles, checked without a Docker engine: the compose file validates against the
Compose Specification JSON schema (the copy vendored by the ``check-jsonschema`` package), every env service runs
the same ``python -m servers.serve`` entry point the server tests start with uvicorn, and the images install no
torch. With an engine: the engine's own ``compose config`` resolves the file (host ports from
``AGENT_RL_ALFWORLD_PORT`` / ``AGENT_RL_WEBSHOP_PORT``); without one that test skips with the reason, or fails
under ``AGENT_RL_COMPOSE_REQUIRED=1`` (``compose_helpers``)."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import tomllib
from importlib import resources
from pathlib import Path

import gymnasium
import jsonschema
import pytest
import yaml

import envs  # noqa: F401  (registers the built-in ids)
from compose_helpers import require_engine
from servers.serve import build_parser

pytestmark = pytest.mark.slow  # containers (fast tier: pytest -m 'not slow')

ROOT = Path(__file__).resolve().parents[1]
ENV_SERVICES = {"alfworld": "agent_rl/ALFWorld-v0", "webshop": "agent_rl/WebShop-v0"}
#: the variable that sets each env service's host port, and its default
HOST_PORTS = {"alfworld": ("AGENT_RL_ALFWORLD_PORT", 8001), "webshop": ("AGENT_RL_WEBSHOP_PORT", 8002)}


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def compose_schema_validator() -> jsonschema.protocols.Validator:
    path = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(path.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_compose_file_is_valid_against_the_compose_specification():
    validator = compose_schema_validator()
    errors = sorted(validator.iter_errors(compose()), key=str)
    assert errors == []


@pytest.mark.parametrize("mutate", [
    lambda c: c["services"]["alfworld"].__setitem__("ports", "8001:8000"),  # must be a list
    lambda c: c["services"]["envs"]["depends_on"]["alfworld"].__setitem__("condition", "service_ready"),
    lambda c: c["services"]["webshop"].__setitem__("healthcheck", {"test": 5}),
    lambda c: c["services"]["alfworld"].__setitem__("comand", ["python"]),  # typo
])
def test_the_schema_check_catches_broken_compose_files(mutate):
    broken = copy.deepcopy(compose())
    mutate(broken)
    assert list(compose_schema_validator().iter_errors(broken))


def test_envs_service_waits_for_every_env_server_to_be_healthy():
    services = compose()["services"]
    assert set(services) == {*ENV_SERVICES, "envs"}
    assert services["envs"]["depends_on"] == {name: {"condition": "service_healthy"} for name in ENV_SERVICES}
    # podman 4.3 ignores the condition: the target itself waits for every server's /health (compose network)
    command = services["envs"]["command"]
    assert command[:3] == ["python", "-m", "servers.wait"]
    assert set(command[3:3 + len(ENV_SERVICES)]) == {f"http://{name}:8000" for name in ENV_SERVICES}


def test_env_services_are_read_only_but_for_the_cache_and_tmp():
    for name in ENV_SERVICES:
        spec = compose()["services"][name]
        assert spec["read_only"] is True and spec["tmpfs"] == ["/tmp"]
        assert "agent_rl_cache:/cache" in spec["volumes"]


@pytest.mark.parametrize("service,env_id", sorted(ENV_SERVICES.items()))
def test_env_services_run_the_serve_entry_point(service, env_id):
    spec = compose()["services"][service]
    command = spec["command"]
    assert command[:3] == ["python", "-m", "servers.serve"]  # what tests/servers start with uvicorn
    args = build_parser().parse_args(command[3:])
    assert args.env_ids == [env_id] and env_id in gymnasium.registry
    assert args.host == "0.0.0.0"  # inside the container; the host side binds loopback (below)
    var, default = HOST_PORTS[service]
    assert spec["ports"] == [f"${{AGENT_RL_BIND:-127.0.0.1}}:${{{var}:-{default}}}:{args.port}"]
    health = " ".join(spec["healthcheck"]["test"])
    assert f"http://127.0.0.1:{args.port}/health" in health
    assert spec["build"]["dockerfile"] == f"servers/{service}/Dockerfile"
    data = [v for v in spec["volumes"] if isinstance(v, dict) and v["target"] == "/data"][0]
    assert data == {"type": "bind", "source": "${AGENT_RL_DATA_HOST:-../shared/data}", "target": "/data",
                    "read_only": True}
    assert spec["environment"]["AGENT_RL_DATA"] == "/data"


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def _requirement_closure(names: list[str]) -> set[str]:
    """Installed distributions reachable from ``names`` through their (non-extra) requirements."""
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = re.sub(r"[-_.]+", "-", stack.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req.replace("extra==", "extra =="):
                continue
            stack.append(re.match(r"\s*([A-Za-z0-9_.\-]+)", req).group(1))
    return seen


@pytest.mark.parametrize("service,env_id", sorted(ENV_SERVICES.items()))
def test_dockerfiles_install_only_server_extras_and_never_torch(service, env_id):
    instructions = _dockerfile_instructions(ROOT / "servers" / service / "Dockerfile")
    froms = [args.split()[0] for op, args in instructions if op == "FROM"]
    assert froms and all(image == "python:3.11-slim" for image in froms)
    installs = [args for op, args in instructions if op == "RUN" and re.search(r"pip (install|wheel)", args)]
    # the requirements list is made from pyproject.toml's dependencies and the extras named by ARG EXTRAS; the
    # project itself is installed without dependencies
    args = dict(a.split("=", 1) for op, a in instructions if op == "ARG" and "=" in a)
    extras = set(args["EXTRAS"].split(","))
    assert extras == {"server", service}
    assert any("-r /tmp/requirements.txt" in line for line in installs)
    assert all("-r /tmp/requirements.txt" in line or "--no-deps" in line for line in installs)
    assert not re.search(r"\btorch\b", " ".join(installs))
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    requirements = [r for extra in extras for r in optional[extra]] + tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.match(r"\s*([A-Za-z0-9_.\-]+)", r).group(1) for r in requirements]
    assert not any(n.startswith("agent_rl") for n in names)  # no self-reference pulling other extras
    assert "torch" not in _requirement_closure(names)
    env = dict(kv.split("=", 1) for op, args in instructions if op == "ENV" for kv in shlex.split(args))
    assert env["AGENT_RL_DATA"] == "/data"
    cmd = json.loads([args for op, args in instructions if op == "CMD"][-1])
    assert cmd[:3] == ["python", "-m", "servers.serve"] and build_parser().parse_args(cmd[3:]).env_ids == [env_id]
    health = [args for op, args in instructions if op == "HEALTHCHECK"]
    assert len(health) == 1 and "/health" in health[0]


def test_torch_check_would_catch_a_torch_extra():
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = [re.match(r"\s*([A-Za-z0-9_.\-]+)", r).group(1) for r in optional["train"]]
    assert "torch" in _requirement_closure(names)


def _published(port: object) -> str:
    """``host_ip:published:target`` of one resolved port entry (podman-compose prints the short string, Docker
    Compose the long mapping)."""
    if isinstance(port, dict):
        return f"{port.get('host_ip', '')}:{port['published']}:{port['target']}"
    return str(port)


@pytest.mark.parametrize("ports", [{}, {"AGENT_RL_ALFWORLD_PORT": "18001", "AGENT_RL_WEBSHOP_PORT": "18002"}])
def test_the_engine_resolves_the_compose_file_and_its_host_ports(ports):
    """What scripts/check_compose.sh relies on to run beside another stack: the engine reads the host ports from
    the environment (defaults 8001/8002), on loopback."""
    engine = require_engine()
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_RL_ALFWORLD_PORT", "AGENT_RL_WEBSHOP_PORT",
                                                                  "AGENT_RL_BIND")}
    env.setdefault("AGENT_RL_SERVER_TOKEN", "tok-compose-config")  # required by the file (no open server)
    run = subprocess.run([*engine, "config"], cwd=ROOT, env={**env, **ports}, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    services = yaml.safe_load(run.stdout)["services"]
    for service, (var, default) in HOST_PORTS.items():
        assert [_published(p) for p in services[service]["ports"]] == [f"127.0.0.1:{ports.get(var, default)}:8000"]
