"""What every simulator is asked for (``SimOptions``) and the per-task options an env id may carry.

A job spec names its environment with one string, so task options travel in
the env id as a query: ``joynexus/Faulty-v0?fault=hang&at_step=3``. Each task
family declares its options as a frozen dataclass; ``parse_task_options``
turns the query's strings into that dataclass, refusing unknown names and
values that do not parse, with the valid ones in the message.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from envs.base import OBS_MODES
from infra.errors import ConfigError

__all__ = ["MAX_IMAGE_SIZE", "MIN_IMAGE_SIZE", "NoOptions", "SimOptions", "parse_task_options",
           "split_env_id"]

MIN_IMAGE_SIZE = 16
MAX_IMAGE_SIZE = 512

T = TypeVar("T")


@dataclass(frozen=True)
class SimOptions:
    """The common knobs of ``make_simulator``; each simulator resolves ``None`` limits to its own."""

    obs_mode: str = "rgb"
    image_size: int = 64
    max_episode_steps: int | None = None
    cameras: int = 1

    def __post_init__(self) -> None:
        if self.obs_mode not in OBS_MODES:
            raise ConfigError(f"obs_mode must be one of {OBS_MODES}, got {self.obs_mode!r}")
        if not MIN_IMAGE_SIZE <= self.image_size <= MAX_IMAGE_SIZE:
            raise ConfigError(f"image_size must be in [{MIN_IMAGE_SIZE}, {MAX_IMAGE_SIZE}], "
                              f"got {self.image_size!r}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ConfigError(f"max_episode_steps must be >= 1 or None, got {self.max_episode_steps!r}")
        if self.cameras < 1:
            raise ConfigError(f"cameras must be >= 1, got {self.cameras!r}")

    @property
    def rgb(self) -> bool:
        return "rgb" in self.obs_mode

    @property
    def state(self) -> bool:
        return "state" in self.obs_mode


@dataclass(frozen=True)
class NoOptions:
    """The options of a task that has none: naming any is an error."""


def split_env_id(env_id: str) -> tuple[str, dict[str, str]]:
    """``'joynexus/Faulty-v0?fault=hang'`` -> ``('joynexus/Faulty-v0', {'fault': 'hang'})``."""
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError(f"env_id must be a non-empty string, got {env_id!r}")
    base, _, query = env_id.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False)
    options = dict(pairs)
    if len(options) != len(pairs):
        raise ConfigError(f"env id {env_id!r} repeats an option")
    return base, options


def _convert(owner: str, name: str, kind: Any, raw: Any) -> Any:
    """One option value: a string from an env id, or an already typed value from code."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1
    if optional:
        if raw is None or (isinstance(raw, str) and raw.lower() in ("", "none", "null")):
            return None
        kind = args[0]
    if typing.get_origin(kind) is typing.Literal:
        allowed = typing.get_args(kind)
        if raw not in allowed:
            raise ConfigError(f"{owner} option {name!r} must be one of {allowed}, got {raw!r}")
        return raw
    try:
        if kind is bool and isinstance(raw, str):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        return kind(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{owner} option {name!r} must be {getattr(kind, '__name__', kind)}, "
                          f"got {raw!r}") from None


def parse_task_options(owner: str, cls: type[T], raw: Mapping[str, Any]) -> T:
    """Builds the task's options dataclass; unknown names are a ``ConfigError`` listing the known ones."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - fields)
    if unknown:
        valid = ", ".join(sorted(fields)) or "none"
        raise ConfigError(f"{owner} has no option(s) {unknown}; valid options: {valid}")
    return cls(**{name: _convert(owner, name, hints[name], value) for name, value in raw.items()})
