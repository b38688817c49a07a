"""``joynexus audit verify``: re-derive every policy version of a tenant from the log, bit for bit.

A tenant's policy is a fold over its feature batches (the architecture's event-sourcing promise).
This module performs that fold again, outside the service, and compares each result with what
the policy store holds:

1. for every training job of the tenant (from the job book: its spec and ``start_version``),
   the root is the version it started from. A root the master created for the job (marker
   ``init:<job>``) is rebuilt from its recorded config alone (module init is seeded by it) and
   must equal the stored bytes; a root that continues an older version is that version, audited
   as part of its own job;
2. the job's ``FeatureBatch`` records are read from ``<prefix>.t.<tenant>.features`` in offset
   order (committed records only) and applied exactly as the optimizer worker does: a sequence
   not beyond the last applied one is a duplicate and skipped; ``train_step`` on the batch's
   features and targets; at a batch with ``publish`` or ``final`` (or the job's
   ``limits.max_steps``) the next version is due;
3. each due version is compared with the stored one: every model tensor and every optimizer /
   RNG tensor with ``torch.equal`` (same dtype and shape), and the step. The stored metadata's
   features offset must be the one right after the batch that published it.

The store's own checks (sha256 in ``meta.json``) only prove the files are the ones the metadata
names; anyone who can write the store can re-sign altered weights. The fold cannot be fooled
that way: it is computed from the log. Reads only (no consumer group, nothing written).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from consumers.bus.replay import replay
from consumers.convert import targets_of, to_feature
from infra.jobbook import JobBook
from infra.settings import Settings
from infra.tensor_store import TensorStore
from infra.topics import tenant_topic
from schemas import events as ev
from schemas.jobspec import JobSpec
from tenants.config import TenantConfig
from tenants.policy_store import CheckpointMeta, PolicyStore
from tenants.slot import SlotState, TenantSlot

__all__ = ["VersionAudit", "audit_tenant", "compare_states"]


@dataclass
class VersionAudit:
    """The verdict on one stored version."""

    version: int
    job_id: str | None
    how: str  # "initial" (rebuilt from its config), "derived" (folded from batches), "unaudited"
    ok: bool
    detail: str = ""
    offsets: list[int] = field(default_factory=list)  # features offsets folded into it (since parent)
    duplicates: int = 0  # batches skipped as already applied (re-emissions)

    @property
    def offset_range(self) -> str:
        return f"{self.offsets[0]}..{self.offsets[-1]}" if self.offsets else "-"


def compare_states(derived: SlotState, stored: SlotState) -> str | None:
    """None when the two are the same bit for bit, else the first difference, named."""
    if derived.step != stored.step:
        return f"step {derived.step} derived, {stored.step} stored"
    for part in ("model", "train"):
        ours, theirs = getattr(derived, part), getattr(stored, part)
        if ours.keys() != theirs.keys():
            return f"{part} tensors differ in names: {sorted(ours.keys() ^ theirs.keys())[:5]}"
        for name in sorted(ours):
            a, b = ours[name], theirs[name]
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                return f"{part} tensor {name!r} differs"
    if derived.optimizer_groups != stored.optimizer_groups:
        return "optimizer hyper-parameters differ"
    return None


def _device(settings: Settings) -> torch.device:
    if settings.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(settings.device)


class _Audit:
    def __init__(self, settings: Settings, tenant: str):
        self.settings, self.tenant = settings, tenant
        self.store = PolicyStore(settings.policy_dir)
        self.tensors = TensorStore(settings.tensor_dir, settings.tensor_inline_max_bytes)
        self.device = _device(settings)
        self.metas: dict[int, CheckpointMeta] = {m.version: m for m in self.store.list(tenant)}
        self.results: dict[int, VersionAudit] = {}

    def _stored(self, version: int) -> SlotState | str:
        try:
            return self.store.load(self.tenant, version).state
        except Exception as exc:  # a corrupt or missing file is a failed audit, not a crash
            return f"stored version unreadable: {exc}"

    def _check(self, result: VersionAudit, slot: TenantSlot) -> None:
        stored = self._stored(result.version)
        if isinstance(stored, str):
            result.ok, result.detail = False, stored
            return
        # the slot's own version counter is bookkeeping, compared through the version chain
        difference = compare_states(slot.state(), stored)
        result.ok, result.detail = difference is None, difference or "bit-identical"

    def root(self, job_id: str, version: int) -> TenantSlot | None:
        """The slot a job starts from; records the verdict on a root the master made for it."""
        meta = self.metas.get(version)
        if meta is None:
            return None
        if f"init:{job_id}" in meta.source_offsets:
            slot = TenantSlot(TenantConfig.from_dict(meta.config))
            slot.version = version
            result = VersionAudit(version, job_id, "initial", False)
            self._check(result, slot)
            self.results[version] = result
            return slot.mount(self.device)  # the fold goes on from what the config rebuilds
        stored = self._stored(version)  # continues an older lineage: audited with its own job
        return None if isinstance(stored, str) else TenantSlot.from_state(stored).mount(self.device)

    def fold(self, spec: JobSpec, slot: TenantSlot, records: Iterable) -> None:
        due = sorted(v for v, m in self.metas.items() if f"job:{spec.job_id}" in m.source_offsets)
        start_step, last_sequence, offsets, duplicates = slot.step, -1, [], 0
        for record in records:
            batch = record.event
            if not isinstance(batch, ev.FeatureBatch) or batch.job_id != spec.job_id:
                continue
            if not due:
                break  # nothing further was published: nothing left to prove
            if batch.sequence <= last_sequence:
                duplicates += 1
                continue
            slot.train_step(to_feature({k: self.tensors.resolve(t) for k, t in batch.features.items()}),
                            targets_of(batch.targets))
            last_sequence = batch.sequence
            offsets.append(record.offset)
            limit = spec.limits.max_steps
            if batch.publish or batch.final or (limit is not None and slot.step - start_step >= limit):
                version = due.pop(0)
                result = VersionAudit(version, spec.job_id, "derived", False, offsets=offsets,
                                      duplicates=duplicates)
                recorded = self.metas[version].source_offsets.get("features")
                if recorded != record.offset + 1:
                    result.detail = (f"published after features offset {recorded - 1 if recorded else '?'}"
                                     f", the fold publishes it after offset {record.offset}")
                else:
                    self._check(result, slot)
                self.results[version] = result
                offsets, duplicates = [], 0
        for version in due:
            self.results[version] = VersionAudit(
                version, spec.job_id, "derived", False,
                "its feature batches are not in the log (retention, or a deleted topic)")


async def audit_tenant(settings: Settings, tenant: str, version: int | None = None) -> list[VersionAudit]:
    """Verdicts on every stored version of ``tenant`` (or only ``version``), oldest first."""
    audit = _Audit(settings, tenant)
    if version is not None and version not in audit.metas:
        raise ValueError(f"tenant {tenant} has no stored version {version}")
    async with JobBook(settings) as book:
        await book.sync(tenant)
        jobs = [s for s in book.of_tenant(tenant)
                if s.kind in ("RL", "SFT") and "start_version" in s.resources]
    records = [r async for r in replay(settings, tenant_topic(settings, tenant, "features"))]
    for state in sorted(jobs, key=lambda s: int(s.resources["start_version"])):
        spec = state.spec
        slot = audit.root(spec.job_id, int(state.resources["start_version"]))
        if slot is not None:  # CPU-bound: off the event loop
            await asyncio.to_thread(audit.fold, spec, slot, records)
    for v in audit.metas.keys() - audit.results.keys():
        audit.results[v] = VersionAudit(v, None, "unaudited", False,
                                        "no accepted job of the tenant produced this version")
    results = [audit.results[v] for v in sorted(audit.results)]
    return [r for r in results if version is None or r.version == version]
