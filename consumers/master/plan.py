"""Compiling a job spec: the tenant's modules, its env sessions, its dataset feed. No Kafka here.

Everything is a pure function of the spec (plus what the environment or the
dataset says about its widths), so the master, the rollout role and a replay
all derive the same session ids, seeds and plans. Session ``<tenant>.<job>-it<k>`` is
RL iteration k; its episode e resets with ``train_seed(spec) + k * E + e``;
evaluation episodes use seeds from ``EVAL_SEED_BASE`` on, never seen in training.
"""

from __future__ import annotations

from dataclasses import dataclass

from envs import open_simulator
from infra.errors import ConfigError, JoynexusError
from producers.dataset.feeder import FeedPlan
from producers.dataset.format import Dataset, DatasetError, layout_batches
from schemas import events as ev
from schemas.jobspec import JobSpec
from tenants.config import HeadConfig, OptimConfig, PPOConfig, SuffixConfig, TenantConfig

__all__ = [
    "EVAL_SEED_BASE",
    "Dims",
    "dataset_dims",
    "env_dims",
    "eval_session",
    "feed_plan",
    "iteration_session",
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


def dataset_dims(spec: JobSpec) -> tuple[Dims, Dataset]:
    try:
        dataset = Dataset(spec.dataset.path)
    except (DatasetError, OSError) as exc:
        raise CompileError("dataset.path", str(exc)) from exc
    meta = dataset.meta
    if not meta.has_images:
        raise CompileError("dataset.path", "the dataset has no images; the backbone needs them")
    return Dims(meta.action_dim, meta.proprio_dim, meta.max_episode_steps), dataset


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


def session_prefix(tenant: str, job_id: str) -> str:
    # Session ids key records in shared consumers (env, inference): they must be unique across
    # tenants, and job ids are only unique within a tenant.
    return f"{tenant}.{job_id}"


def rl_session_id(tenant: str, job_id: str, iteration: int) -> str:
    return f"{session_prefix(tenant, job_id)}-it{iteration}"


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


def iteration_session(
    spec: JobSpec, iteration: int, version: int | None, producer: str
) -> ev.EnvSessionRequested:
    """RL iteration k (sync: pinned to the version it collects with)."""
    e = spec.rl.episodes_per_iteration
    return _session(
        spec,
        rl_session_id(spec.tenant, spec.job_id, iteration),
        train_seed(spec) + iteration * e,
        e,
        version,
        False,
        producer,
    )


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
        f"{session_prefix(spec.tenant, spec.job_id)}-eval",
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
    )
