"""The group training step: one backbone forward's features, split back to each tenant's slot.

Each tenant's loss, backward and optimizer update run on its own slot only,
one tenant after another, in a fixed (sorted) order. A tenant whose step
raises, or whose loss or gradients are not finite, gets an error result (and,
unless its batch was merely refused, a failed slot); the others' results are
exactly what they would have been without it, because slots share no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from backbone.feature import VLAFeature
from infra.logging import get_logger
from tenants.errors import InvalidBatch
from tenants.slot import TenantSlot
from tenants.targets import Targets

__all__ = ["StepResult", "group_train_step", "split_group"]

log = get_logger("tenants.group_step")


@dataclass(frozen=True)
class StepResult:
    tenant_id: str
    step: int  # the slot's step counter after this call
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # why there was no update; None when the update was applied
    slot_failed: bool = False  # the slot is now marked failed (a refused batch leaves it healthy)

    @property
    def ok(self) -> bool:
        return self.error is None


def split_group(feature: VLAFeature, sizes: Mapping[str, int]) -> dict[str, VLAFeature]:
    """A group's feature batch back into per-tenant features, rows in the order of ``sizes``."""
    return dict(zip(sizes, feature.split(list(sizes.values())), strict=True))


def group_train_step(slots: Mapping[str, TenantSlot],
                     batches: Mapping[str, tuple[VLAFeature, Targets]]) -> dict[str, StepResult]:
    """One update for every tenant in ``batches``; never raises for a single tenant's trouble."""
    results: dict[str, StepResult] = {}
    for tenant in sorted(batches):
        slot = slots.get(tenant)
        if slot is None:
            results[tenant] = StepResult(tenant, -1, error=f"no slot mounted for tenant {tenant}")
            continue
        feature, targets = batches[tenant]
        try:
            metrics = slot.train_step(feature, targets)
        except InvalidBatch as exc:
            results[tenant] = StepResult(tenant, slot.step, error=f"InvalidBatch: {exc}")
        except Exception as exc:  # one tenant's failure must not end the others' step
            reason = slot.failure or f"{type(exc).__name__}: {exc}"
            results[tenant] = StepResult(tenant, slot.step, error=reason, slot_failed=slot.failed)
        else:
            results[tenant] = StepResult(tenant, slot.step, metrics)
            continue
        if not results[tenant].slot_failed:  # a failing slot has logged its reason itself
            log.warning("tenant_step_refused", tenant=tenant, reason=results[tenant].error)
    return results
