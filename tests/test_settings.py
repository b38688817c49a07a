from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.settings import Settings


def test_env_prefix_sets_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOYNEXUS_BROKER_PORT", "19999")
    monkeypatch.setenv("JOYNEXUS_HOME", "/tmp/jx-somewhere")
    settings = Settings(_env_file=None)
    assert settings.broker_port == 19999
    assert settings.bootstrap == "127.0.0.1:19999"
    assert settings.home == Path("/tmp/jx-somewhere")


def test_explicit_bootstrap_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOYNEXUS_BOOTSTRAP_SERVERS", "kafka:9092")
    assert Settings(_env_file=None).bootstrap == "kafka:9092"


def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOYNEXUS_BROKER_PORT", "70000")
    with pytest.raises(ValidationError, match="broker_port"):
        Settings(_env_file=None)


@pytest.mark.parametrize("bad", ["a.b", "Nexus", "", "-x", "x" * 33, "ne_xus"])
def test_topic_prefix_without_dots(bad: str) -> None:
    # A dot in the prefix would make every topic name ambiguous to infra.topics.parse_topic.
    with pytest.raises(ValidationError, match="topic_prefix"):
        Settings(topic_prefix=bad, _env_file=None)
