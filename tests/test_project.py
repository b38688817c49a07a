"""Project-level promises: one Kafka version everywhere, the layering rules of the
architecture page, and the README's two commands."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import yaml

from infra.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def test_one_kafka_version_everywhere() -> None:
    pom = re.search(r"<kafka.version>(.+?)</kafka.version>",
                    (ROOT / "infra/kafka/pom.xml").read_text()).group(1)
    compose = yaml.safe_load((ROOT / "infra/docker-compose.yml").read_text())
    image = compose["services"]["kafka"]["image"]
    default = Settings.model_fields["kafka_version"].default
    readme = (ROOT / "README.md").read_text()
    assert image == f"apache/kafka:{pom}"
    assert compose["services"]["kafka-secure"]["image"] == image  # the secure profile too
    assert default == pom
    assert f"Apache Kafka {pom}" in readme


# The roles where compute meets the bus (the architecture page: "a role in consumers/ is the only
# place where the two meet"); every other module of consumers/ is bus code.
ROLE_MODULES = {"inference.py", "backbone_train.py", "optimizer.py", "convert.py", "service.py",
                "audit.py"}
COMPUTE = ("backbone", "tenants", "envs")
BUS = {"aiokafka", "faust", "kafka", "producers", "consumers"}


def _imports(folder: str, skip: set[str] = frozenset()) -> set[str]:
    names: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        if path.name in skip and path.parent == ROOT / folder:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_compute_never_imports_kafka() -> None:
    for folder in COMPUTE:
        assert not _imports(folder) & BUS, folder


def test_producers_never_import_consumers() -> None:
    assert "consumers" not in _imports("producers")


def test_bus_never_imports_tensor_libraries() -> None:
    for folder in ("producers", "consumers", "schemas"):
        assert not _imports(folder, ROLE_MODULES) & {"torch", "transformers", "peft"}, folder
    # the bus plumbing does not even reach compute: no role logic, no tensors
    assert not _imports("consumers/bus") & {"backbone", "tenants", "envs", "torch"}


def test_the_layering_check_sees_a_bad_import(tmp_path, monkeypatch) -> None:
    # The rules above are only worth something if _imports finds what a rule forbids.
    bad = tmp_path / "envs"
    bad.mkdir()
    (bad / "leak.py").write_text("def f():\n    from consumers.bus.loop import make_consumer\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert "consumers" in _imports("envs")


def test_only_schemas_imports_avro() -> None:
    for folder in ("producers", "consumers", "backbone", "tenants", "infra"):
        assert "fastavro" not in _imports(folder), folder


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    assert "exec make test" in (ROOT / ".ci/run").read_text()


def test_simulators_and_datasets_never_import_kafka() -> None:
    import subprocess
    import sys

    probe = ("import sys, envs, producers.dataset.format, producers.dataset.generate; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiokafka', 'faust')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_bus_plumbing_env_and_health_never_load_tensor_libraries() -> None:
    # The rule above reads direct imports only; this one follows every import, as a process does:
    # the env and health roles, the CLI and the bus plumbing start without torch (a 5-20 s import
    # on a loaded 2-core machine, README "Known limits"), and a user's client does not need it.
    import subprocess
    import sys

    modules = ("consumers.bus.loop", "consumers.bus.transform", "consumers.bus.replay",
               "consumers.bus.episodes", "consumers.bus.dlq", "producers.producer", "producers.heartbeat",
               "producers.client.sdk", "infra.follow", "schemas.codec", "consumers.env.worker",
               "consumers.health", "infra.runtime.host", "infra.cli")
    probe = (f"import sys, {', '.join(modules)}; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'peft')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
