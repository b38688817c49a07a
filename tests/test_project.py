"""Project-level promises: one Kafka version everywhere, the layering rules of the
architecture page, and the README's two commands."""

from __future__ import annotations

import ast
import re
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
    assert default == pom
    assert f"Apache Kafka {pom}" in readme


# The roles where compute meets the bus (the architecture page: "a role in consumers/ is the only
# place where the two meet"); every other module of consumers/ is bus code.
ROLE_MODULES = {"inference.py", "backbone_train.py", "optimizer.py", "convert.py", "service.py"}


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
    for folder in ("backbone", "tenants"):
        assert not _imports(folder) & {"aiokafka", "faust", "kafka", "producers", "consumers"}, folder


def test_bus_never_imports_tensor_libraries() -> None:
    for folder in ("producers", "consumers", "schemas"):
        assert not _imports(folder, ROLE_MODULES) & {"torch", "transformers", "peft"}, folder


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

    probe = ("import sys, consumers.env.sim, producers.dataset.format, producers.dataset.generate; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiokafka', 'faust')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
