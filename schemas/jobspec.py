"""The job spec: what a tenant asks for, as a YAML/JSON file or a Python object.

One pydantic model per section, every field with a default a user can live
with, and ``extra="forbid"`` everywhere so a typo is an error, not a silently
ignored knob. ``JobSpec.parse`` turns any input into a spec or a
``JobSpecInvalid`` carrying one ``(loc, message)`` per bad field; the master
sends exactly those in its ``JobRejected``.

What the spec cannot know by itself (the action and proprio widths of an
environment or a dataset, the backbone's hidden size) the master fills in when
it compiles the job (``consumers/master/plan.py``).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra.errors import JoynexusError
from infra.tenant_id import validate_tenant_id

__all__ = ["DatasetSpec", "EnvSpec", "EvalSpec", "JobSpec", "JobSpecInvalid", "LimitsSpec",
           "ModulesSpec", "OptimSpec", "RLSpec", "SFTSpec"]

JOB_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"


class JobSpecInvalid(JoynexusError):
    """A job spec that cannot run; ``errors`` lists ``(loc, message)`` per bad field."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{loc}: {msg}" for loc, msg in errors))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvSpec(_Section):
    env_id: str = "joynexus/Reach-v0"
    obs_mode: Literal["rgb", "state", "rgb+state"] = "rgb+state"
    image_size: int = Field(32, ge=16, le=512)
    cameras: int = Field(1, ge=1, le=4)
    max_episode_steps: int | None = Field(30, ge=1)
    # the state vector (goal positions...) joins proprio: RL from pixels alone is slow on a CPU
    state_in_proprio: bool = True

    @model_validator(mode="after")
    def _state_needs_state(self) -> EnvSpec:
        if self.state_in_proprio and "state" not in self.obs_mode:
            raise ValueError("state_in_proprio needs obs_mode 'state' or 'rgb+state'")
        return self


class DatasetSpec(_Section):
    path: str  # a dataset directory (producers/dataset/format.py); `joynexus dataset generate` writes one
    # the recorded state vector joins proprio, as EnvSpec.state_in_proprio does for an env session;
    # the dataset must be recorded with obs_mode "rgb+state"
    state_in_proprio: bool = False


class ModulesSpec(_Section):
    """The tenant's action modules (tenants/config.py): head, optional policy suffix."""

    # auto: a Gaussian actor-critic for RL, chunk regression for SFT
    head: Literal["auto", "chunk_regression", "gaussian_actor_critic"] = "auto"
    chunk_len: int = Field(1, ge=1, le=64)
    hidden: int = Field(128, ge=1, le=8192)
    depth: int = Field(2, ge=1, le=16)
    init_log_std: float = -0.5
    suffix: bool = False  # a policy-suffix block over the backbone's tokens, trained through LoRA
    lora_rank: int = Field(8, ge=1, le=256)


class OptimSpec(_Section):
    lr: float = Field(3e-3, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)


class RLSpec(_Section):
    iterations: int = Field(8, ge=1, le=100_000)
    episodes_per_iteration: int = Field(8, ge=1, le=10_000)
    # measured on Reach (8 episodes x 30 steps per iteration): 10 epochs and a short horizon learn
    # within 10 iterations; gamma .99 / lambda .95 did not improve at all in that budget
    ppo_epochs: int = Field(10, ge=1, le=100)
    minibatch_size: int = Field(64, ge=1, le=4096)
    gamma: float = Field(0.9, gt=0, le=1)
    gae_lambda: float = Field(0.9, ge=0, le=1)
    clip_eps: float = Field(0.2, gt=0, le=1)
    value_coef: float = Field(0.5, ge=0)
    entropy_coef: float = Field(0.0, ge=0)
    # sync: collect with v, train, publish v+1, then collect again (deterministic);
    # async: collection never waits; samples more than max_policy_lag versions old are dropped
    mode: Literal["sync", "async"] = "sync"
    max_policy_lag: int = Field(1, ge=0)
    # sessions collecting at once: sync splits each iteration's episodes between them (same result
    # for any count), async runs them all the time
    envs: int = Field(1, ge=1, le=256)


class SFTSpec(_Section):
    epochs: int = Field(2, ge=1, le=10_000)
    batch_size: int = Field(32, ge=1, le=4096)
    publish_every: int = Field(20, ge=1)  # optimizer steps between policy versions


class EvalSpec(_Section):
    policy_version: int | None = Field(None, ge=1)  # None: the tenant's latest at submission
    episodes: int = Field(8, ge=1, le=100_000)


class LimitsSpec(_Section):
    max_steps: int | None = Field(None, ge=1)  # optimizer steps; the job completes early when reached
    max_wall_time_s: float | None = Field(None, gt=0)  # the job fails when exceeded
    max_staleness: int | None = Field(None, ge=0)  # async RL: overrides rl.max_policy_lag


class JobSpec(_Section):
    kind: Literal["sft", "rl", "eval"]
    tenant: str
    job_id: str = Field(default_factory=lambda: f"job-{uuid.uuid4().hex[:12]}", pattern=JOB_ID_PATTERN)
    backbone: str | None = None  # a preset name or checkpoint dir; must be the service's resident backbone
    # seeds module init, episode resets and action noise; episode seeds repeat every 2**15 spec seeds
    seed: int = Field(0, ge=0, lt=2**31)
    init_version: int | None = Field(None, ge=1)  # sft/rl: continue from this version; None: fresh modules
    modules: ModulesSpec = ModulesSpec()
    optim: OptimSpec = OptimSpec()
    env: EnvSpec | None = None
    dataset: DatasetSpec | None = None
    rl: RLSpec | None = None
    sft: SFTSpec | None = None
    eval: EvalSpec | None = None
    limits: LimitsSpec = LimitsSpec()

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        validate_tenant_id(value)
        return value

    @model_validator(mode="after")
    def _sections_fit_kind(self) -> JobSpec:
        need = {"rl": ("env",), "sft": ("dataset",), "eval": ()}[self.kind]
        for name in need:
            if getattr(self, name) is None:
                raise ValueError(f"a {self.kind} job needs an '{name}' section")
        if self.kind == "eval" and (self.env is None) == (self.dataset is None):
            raise ValueError("an eval job needs exactly one of 'env' (episodes) or 'dataset' (held out)")
        other = {"rl": ("dataset", "sft", "eval"), "sft": ("env", "rl", "eval"),
                 "eval": ("rl", "sft")}
        for name in other[self.kind]:
            if getattr(self, name) is not None:
                raise ValueError(f"a {self.kind} job takes no '{name}' section")
        if self.kind == "rl" and self.modules.head == "chunk_regression":
            raise ValueError("RL needs a gaussian_actor_critic head (modules.head)")
        # fill the kind's own section so downstream code never has to ask
        defaults = {"rl": ("rl", RLSpec), "sft": ("sft", SFTSpec), "eval": ("eval", EvalSpec)}
        name, section = defaults[self.kind]
        if getattr(self, name) is None:
            object.__setattr__(self, name, section())
        return self

    @property
    def head_kind(self) -> str:
        if self.modules.head != "auto":
            return self.modules.head
        return "chunk_regression" if self.kind == "sft" else "gaussian_actor_critic"

    # ------------------------------------------------------------ input and output
    @classmethod
    def parse(cls, data: str | bytes | dict[str, Any] | JobSpec) -> JobSpec:
        """A spec from a dict, JSON or YAML text; raises JobSpecInvalid with every bad field."""
        if isinstance(data, JobSpec):
            return data
        if isinstance(data, str | bytes):
            try:
                data = yaml.safe_load(data)  # YAML is a superset of JSON
            except yaml.YAMLError as exc:
                raise JobSpecInvalid([("spec", f"not YAML/JSON: {exc}")]) from None
        if not isinstance(data, dict):
            raise JobSpecInvalid([("spec", f"must be a mapping, got {type(data).__name__}")])
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise JobSpecInvalid([(".".join(str(p) for p in e["loc"]) or "spec", e["msg"])
                                  for e in exc.errors()]) from None

    @classmethod
    def from_file(cls, path: str | Path) -> JobSpec:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise JobSpecInvalid([("file", f"{path}: {exc.strerror}")]) from None
        return cls.parse(text)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)
