"""TenantSlot: one tenant's modules, optimizer, RNG, counters and health, mounted on a device.

A slot is the unit of isolation: it owns its parameters, gradients, optimizer
state and ``torch.Generator``, and a step touches nothing else. In particular
a step never reads or advances the process's global RNG (modules have no
dropout; sampling draws from the slot's generator), so the order in which a
process steps its slots cannot change any slot's result.

Health: a loss or gradient norm that is NaN/Inf skips the update (parameters
and optimizer state stay as they were), marks the slot failed with the reason
and raises ``NonFiniteLoss``; a failed slot refuses further steps until a
checkpoint is loaded into it. A batch that does not fit raises ``InvalidBatch``
before anything changes and leaves the slot healthy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backbone.feature import VLAFeature
from infra.errors import ConfigError
from infra.logging import get_logger
from tenants.config import TenantConfig
from tenants.errors import NonFiniteLoss, SlotFailed, SlotNotMounted
from tenants.heads import ActorOutput
from tenants.optim import (
    build_optimizer,
    export_optimizer,
    import_optimizer,
    learning_rate,
    move_optimizer_state,
)
from tenants.policy import build_policy
from tenants.targets import Targets, check_batch, check_feature

__all__ = ["RNG_KEY", "SlotMemory", "SlotState", "TenantSlot"]

RNG_KEY = "rng.generator"


@dataclass(frozen=True)
class SlotMemory:
    """Bytes a slot holds: parameters (frozen suffix base included), allocated gradients, optimizer state.

    ``shared_param_bytes`` is the part of ``param_bytes`` that is the process's shared suffix base
    (``tenants/shared_base.py``): paid once per process, not per tenant; ``own_bytes`` is the rest.
    """

    param_bytes: int
    trainable_param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    shared_param_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def own_bytes(self) -> int:
        """What one more tenant with this slot costs once the shared base exists."""
        return self.total_bytes - self.shared_param_bytes


@dataclass(frozen=True)
class SlotState:
    """A snapshot of everything that determines a slot's future: what a checkpoint holds."""

    config: TenantConfig
    step: int
    version: int
    model: dict[str, torch.Tensor]  # the policy's state_dict, CPU copies
    train: dict[str, torch.Tensor]  # optimizer state by name and the generator state (RNG_KEY)
    optimizer_groups: list[dict[str, Any]]  # AdamW hyper-parameters per group, JSON-able


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class TenantSlot:
    """One tenant's trainable state. Created unmounted; ``mount(device)`` before stepping.

    Not thread-safe: a process steps its slots one at a time (they never share state, so the order
    does not matter).
    """

    def __init__(self, config: TenantConfig):
        self.config = config
        self.generator = torch.Generator().manual_seed(config.seed)
        init_seed = int(torch.randint(0, 2**62, (), generator=self.generator))
        self.policy = build_policy(config, init_seed)
        trainable = [(n, p) for n, p in self.policy.named_parameters() if p.requires_grad]
        self._names = {id(p): n for n, p in trainable}
        self._trainable = [p for _, p in trainable]
        self.optimizer = build_optimizer(trainable, config.optim)
        self.step = 0  # optimizer updates applied since initialisation
        self.version = 0  # policy version this slot was last saved as or loaded from; 0: never saved
        self.failure: str | None = None
        self.device: torch.device | None = None
        self.log = get_logger("tenants.slot", tenant=config.tenant_id)

    @property
    def tenant_id(self) -> str:
        return self.config.tenant_id

    @property
    def mounted(self) -> bool:
        return self.device is not None

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def mount(self, device: torch.device | str = "cpu") -> TenantSlot:
        """Places modules, gradients and optimizer state on ``device``; the slot can then step."""
        self.device = torch.device(device)
        self.policy.to(self.device)
        move_optimizer_state(self.optimizer, self.device)
        return self

    def unmount(self) -> TenantSlot:
        """Offloads everything to CPU and drops gradients (each step recomputes them from zero)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.policy.to("cpu")
        move_optimizer_state(self.optimizer, torch.device("cpu"))
        self.device = None
        return self

    def _ready(self) -> torch.device:
        if self.failure is not None:
            raise SlotFailed(f"slot of tenant {self.tenant_id} failed earlier: {self.failure}")
        if self.device is None:
            raise SlotNotMounted(f"slot of tenant {self.tenant_id} is not mounted")
        return self.device

    def train_step(self, feature: VLAFeature, targets: Targets) -> dict[str, float]:
        """Loss, backward, clip, AdamW update on this slot only; returns the step's metrics."""
        device = self._ready()
        check_batch(self.config, feature, targets)
        # detach: a tenant's backward must never reach into the shared group's graph
        feature, targets = feature.detach().to(device), targets.to(device)
        self.optimizer.zero_grad(set_to_none=True)
        try:
            loss, metrics = self.policy.loss(feature, targets)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"loss is {loss.item()} at step {self.step}")
            loss.backward()
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self._trainable if p.grad is not None])
            if not torch.isfinite(grad_norm):
                raise NonFiniteLoss(f"gradient norm is {grad_norm.item()} at step {self.step}")
            if self.config.optim.grad_clip is not None:
                torch.nn.utils.clip_grads_with_norm_(self._trainable, self.config.optim.grad_clip, grad_norm)
            lr = learning_rate(self.config.optim, self.step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
        except Exception as exc:
            self._fail(exc)
            raise
        self.step += 1
        return {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": lr,
                **{k: v.item() for k, v in metrics.items()}}

    def _fail(self, exc: Exception) -> None:
        # After an exception mid-step the gradients are partial or poisoned; the parameters are
        # unchanged unless optimizer.step itself raised, which is why a failed slot must be reloaded.
        self.failure = str(exc) if isinstance(exc, NonFiniteLoss) else f"{type(exc).__name__}: {exc}"
        self.optimizer.zero_grad(set_to_none=True)
        self.log.warning("slot_failed", reason=self.failure, step=self.step)

    @torch.no_grad()
    def act(self, feature: VLAFeature, deterministic: bool = False) -> ActorOutput | torch.Tensor:
        """Rollout actions; Gaussian sampling draws from (and advances) this slot's generator."""
        device = self._ready()
        check_feature(self.config, feature)
        return self.policy.act(feature.detach().to(device), self.generator, deterministic)

    def memory(self) -> SlotMemory:
        params = list(self.policy.parameters())
        shared = dict(self.policy.named_parameters())
        shared_bytes = sum(_nbytes(shared[n]) for n in self.policy.shared_parameter_names() if n in shared)
        return SlotMemory(
            param_bytes=sum(_nbytes(p) for p in params),
            trainable_param_bytes=sum(_nbytes(p) for p in params if p.requires_grad),
            grad_bytes=sum(_nbytes(p.grad) for p in params if p.grad is not None),
            optimizer_bytes=sum(_nbytes(v) for s in self.optimizer.state.values() for v in s.values()
                                if isinstance(v, torch.Tensor)),
            shared_param_bytes=shared_bytes,
        )

    def state(self) -> SlotState:
        model = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self.policy.state_dict().items()}
        optimizer_tensors, groups = export_optimizer(self.optimizer, self._names)
        train = {**optimizer_tensors, RNG_KEY: self.generator.get_state().clone()}
        return SlotState(self.config, self.step, self.version, model, train, groups)

    def load_state(self, state: SlotState) -> None:
        """Replaces everything with ``state`` (also the way back from a failure)."""
        if state.config != self.config:
            raise ConfigError(f"state of tenant {state.config.tenant_id} has a different config than "
                              f"the slot of tenant {self.tenant_id}")
        self.policy.load_state_dict(state.model, strict=True)
        import_optimizer(self.optimizer, self._names, state.train, state.optimizer_groups)
        if self.device is not None:
            move_optimizer_state(self.optimizer, self.device)
        self.generator.set_state(state.train[RNG_KEY])
        self.optimizer.zero_grad(set_to_none=True)
        self.step, self.version, self.failure = state.step, state.version, None

    @classmethod
    def from_state(cls, state: SlotState) -> TenantSlot:
        """An unmounted slot holding ``state``."""
        slot = cls(state.config)
        slot.load_state(state)
        return slot
