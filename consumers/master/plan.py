"""Compiling a job spec: the tenant's modules, its env sessions, its dataset feed. No Kafka here.

Everything is a pure function of the spec (plus what the environment or the
dataset says about its widths), so the master, the rollout role and a replay
all derive the same session ids, seeds and plans (names: ``schemas/sessions.py``).
Sync RL iteration k is one session, or ``rl.envs`` parallel sessions that split its E
episodes into contiguous runs; either way its episode e resets with
``train_seed(spec) + k * E + e`` and draws the action noise of that seed, so which
session (and which env worker) plays an episode changes nothing in it. Evaluation
episodes use seeds from ``EVAL_SEED_BASE`` on, never seen in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envs import open_simulator
from infra.errors import ConfigError, JoynexusError
from infra.settings import Settings
from producers.dataset.feeder import FeedPlan
from producers.dataset.format import Dataset, DatasetError, layout_batches
from schemas import events as ev
from schemas.jobspec import JobSpec
from schemas.sessions import eval_session_id, part_slices, rl_session_id, session_prefix
from tenants.config import HeadConfig, OptimConfig, PPOConfig, SuffixConfig, TenantConfig

__all__ = [
    "EVAL_SEED_BASE",
    "Dims",
    "dataset_dims",
    "dataset_path",
    "env_dims",
    "eval_session",
    "feed_plan",
    "iteration_parts",
    "iteration_sessions",
    "rl_session_id",
    "tenant_config",
]

# Simulators take seeds in [0, 2**32): training seeds live below 2**31, evaluation seeds above.
# A job owns SEED_STRIDE consecutive seeds; spec seeds are folded into 2**15 such blocks.
EVAL_SEED_BASE = 1 << 31
SEED_STRIDE = 1 << 16
SEED_BLOCKS = 1 << 15


class CompileError(JoynexusError):
    """The spec is valid but cannot run here; ``loc`` names the field to blame."""

    def __init__(self, loc: str, message: str):
        self.loc = loc
        super().__init__(message)


@dataclass(frozen=True)
class Dims:
    action_dim: int
    proprio_dim: int  # what the head sees: the simulator's proprio (+ state when asked)
    max_episode_steps: int


def env_dims(spec: JobSpec) -> Dims:
    """Starts the simulator once to read its spec (blocking: call it in a thread; ManiSkill starts
    in a child process, see ``envs.open_simulator``)."""
    env = spec.env
    try:
        sim = open_simulator(
            env.env_id,
            obs_mode=env.obs_mode,
            image_size=env.image_size,
            cameras=env.cameras,
            max_episode_steps=env.max_episode_steps,
        )
    except ConfigError as exc:
        raise CompileError("env", str(exc)) from exc
    except JoynexusError as exc:
        raise CompileError("env.env_id", f"the simulator does not start: {exc}") from exc
    try:
        s = sim.spec
        if "rgb" not in env.obs_mode:
            raise CompileError("env.obs_mode", "the backbone needs images: use rgb or rgb+state")
        extra = s.state_dim if env.state_in_proprio else 0
        return Dims(s.action_dim, s.proprio_dim + extra, s.max_episode_steps)
    finally:
        sim.close()


def dataset_path(spec: JobSpec, settings: Settings) -> Path:
    """Where a job's dataset is read from. Confined (a secure broker, or ``datasets_dir`` set):
    only under ``<datasets_root>/<tenant>/``, a relative ``dataset.path`` taken from there and an
    absolute one refused unless it lies inside (links resolved first), so a job cannot make the
    service read another tenant's data or any other file on its machine. Not confined (the
    default, single-user profile): the path as given."""
    given = Path(spec.dataset.path).expanduser()
    if not (settings.secure or settings.datasets_dir is not None):
        return given
    root = (settings.datasets_root / spec.tenant).resolve()
    resolved = (given if given.is_absolute() else root / given).resolve()
    if not resolved.is_relative_to(root):
        raise CompileError("dataset.path", f"datasets of tenant {spec.tenant} are read from {root} "
                           f"only (give a path relative to it); {spec.dataset.path!r} is outside")
    return resolved


def dataset_dims(spec: JobSpec, settings: Settings) -> tuple[Dims, Dataset]:
    path = dataset_path(spec, settings)
    try:
        dataset = Dataset(path)
    except (DatasetError, OSError) as exc:
        raise CompileError("dataset.path", str(exc)) from exc
    meta = dataset.meta
    if not meta.has_images:
        raise CompileError("dataset.path", "the dataset has no images; the backbone needs them")
    extra = 0
    if spec.dataset.state_in_proprio:
        if not meta.has_state:
            raise CompileError("dataset.state_in_proprio", f"the dataset has no state (obs_mode "
                                                           f"{meta.obs_mode!r}); record it with rgb+state")
        extra = meta.state_dim
    return Dims(meta.action_dim, meta.proprio_dim + extra, meta.max_episode_steps), dataset


def tenant_config(spec: JobSpec, hidden_size: int, dims: Dims) -> TenantConfig:
    m, o = spec.modules, spec.optim
    rl = spec.rl
    head = HeadConfig(
        kind=spec.head_kind,
        action_dim=dims.action_dim,
        chunk_len=m.chunk_len,
        proprio_dim=dims.proprio_dim,
        hidden=m.hidden,
        depth=m.depth,
        init_log_std=m.init_log_std,
    )
    ppo = PPOConfig(rl.clip_eps, rl.value_coef, rl.entropy_coef) if rl else PPOConfig()
    return TenantConfig(
        tenant_id=spec.tenant,
        hidden_size=hidden_size,
        head=head,
        suffix=SuffixConfig(lora_rank=m.lora_rank) if m.suffix else None,
        optim=OptimConfig(
            lr=o.lr, weight_decay=o.weight_decay, warmup_steps=o.warmup_steps, grad_clip=o.grad_clip
        ),
        ppo=ppo,
        seed=spec.seed,
    )


def train_seed(spec: JobSpec) -> int:
    return (spec.seed % SEED_BLOCKS) * SEED_STRIDE


def _envelope(spec: JobSpec, producer: str) -> ev.Envelope:
    return ev.Envelope(tenant_id=spec.tenant, producer_id=producer, correlation_id=spec.job_id)


def _session(
    spec: JobSpec,
    session_id: str,
    seed: int,
    episodes: int | None,
    version: int | None,
    deterministic: bool,
    producer: str,
) -> ev.EnvSessionRequested:
    env = spec.env
    return ev.EnvSessionRequested(
        envelope=_envelope(spec, producer),
        session_id=session_id,
        job_id=spec.job_id,
        env_id=env.env_id,
        obs_mode=env.obs_mode,
        image_size=env.image_size,
        cameras=env.cameras,
        seed=seed,
        episodes=episodes,
        max_episode_steps=env.max_episode_steps,
        policy_version=version,
        deterministic=deterministic,
        action_seed=spec.seed,
        state_in_proprio=env.state_in_proprio,
    )


def iteration_parts(spec: JobSpec, iteration: int) -> list[tuple[str, int, int]]:
    """Sync RL iteration k's ``min(rl.envs, E)`` parts as (session id, first episode, episodes):
    part j plays the contiguous run of episodes ``part_slices`` gives it. The rollout role asks
    this after every poll, so it builds no events."""
    slices = part_slices(spec.rl.episodes_per_iteration, spec.rl.envs)
    alone = len(slices) == 1
    return [(rl_session_id(spec.tenant, spec.job_id, iteration, None if alone else j), first, count)
            for j, (first, count) in enumerate(slices)]


def iteration_sessions(
    spec: JobSpec, iteration: int, version: int | None, producer: str
) -> list[ev.EnvSessionRequested]:
    """Sync RL iteration k (pinned to the version it collects with): one session per part of
    ``iteration_parts``, with its episodes' seeds."""
    first_seed = train_seed(spec) + iteration * spec.rl.episodes_per_iteration
    return [_session(spec, session_id, first_seed + first, count, version, False, producer)
            for session_id, first, count in iteration_parts(spec, iteration)]


def async_sessions(spec: JobSpec, producer: str) -> list[ev.EnvSessionRequested]:
    """Async RL: ``envs`` sessions that follow the latest version until the job closes them."""
    return [
        _session(
            spec,
            f"{session_prefix(spec.tenant, spec.job_id)}-env{i}",
            train_seed(spec) + i * (SEED_STRIDE // spec.rl.envs),
            None,
            None,
            False,
            producer,
        )
        for i in range(spec.rl.envs)
    ]


def eval_session(spec: JobSpec, version: int, producer: str) -> ev.EnvSessionRequested:
    return _session(
        spec,
        eval_session_id(spec.tenant, spec.job_id),
        EVAL_SEED_BASE + train_seed(spec),
        spec.eval.episodes,
        version,
        True,
        producer,
    )


def sft_steps(spec: JobSpec, dataset: Dataset) -> int:
    """Optimizer steps of an SFT job: batches per epoch x epochs, capped by limits.max_steps."""
    total = len(layout_batches(dataset, spec.sft.batch_size, spec.seed, 0)) * spec.sft.epochs
    return total if spec.limits.max_steps is None else min(total, spec.limits.max_steps)


def feed_plan(spec: JobSpec, version: int, chunk_len: int) -> FeedPlan:
    sft = spec.sft
    return FeedPlan(
        tenant=spec.tenant,
        job_id=spec.job_id,
        batch_size=sft.batch_size,
        epochs=sft.epochs,
        seed=spec.seed,
        chunk_len=chunk_len,
        policy_version=version,
        publish_every=sft.publish_every,
        needs_sequence=spec.modules.suffix,
        max_batches=spec.limits.max_steps,
        state_in_proprio=spec.dataset.state_in_proprio,
    )
