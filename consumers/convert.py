"""Where events meet compute: observations and gradient jobs into backbone requests, features and
targets into FeatureBatch tensors and back. Copies and reshapes only, no math.

A GradientJob holds one minibatch, or (``minibatches`` set) an iteration's rows, each sent once,
with the row indices of every minibatch: ``minibatch_rows`` checks those indices and
``minibatch_targets`` cuts the targets to one of them (rows copied, never computed).

A FeatureBatch carries ``pooled`` and ``proprio`` always and the token states
(``sequence``, ``attention_mask``) only when the tenant's modules read them
(a policy suffix): for a pooled-feature head they would be most of the bytes
and never used. Without them, ``to_feature`` gives a one-token sequence
holding the pooled vector, which is all such a head looks at.
"""

from __future__ import annotations

import numpy as np
import torch

from backbone.feature import VLAFeature
from backbone.inputs import VLARequest
from infra.errors import DecodeError
from schemas import events as ev
from schemas.tensors import from_numpy, to_numpy
from tenants.targets import PPOTargets, SFTTargets, Targets

__all__ = [
    "feature_tensors",
    "gradient_job_requests",
    "minibatch_rows",
    "minibatch_targets",
    "observation_request",
    "targets_of",
    "to_feature",
    "torch_of",
]


def torch_of(tensor: ev.Tensor) -> torch.Tensor:
    return torch.from_numpy(to_numpy(tensor).copy())


def _images(array: np.ndarray) -> list[np.ndarray]:
    # one HxWx3 image per camera; a single image may come without the camera axis
    return [array] if array.ndim == 3 else list(array)


def observation_request(obs: ev.Observation, state_in_proprio: bool) -> VLARequest:
    if obs.image is None:
        raise DecodeError("the observation has no image; the backbone needs one")
    proprio = to_numpy(obs.proprio).astype(np.float32) if obs.proprio is not None else np.zeros(0, np.float32)
    if state_in_proprio:
        if obs.state is None:
            raise DecodeError("the session asks for state in proprio but the observation has no state")
        proprio = np.concatenate([proprio, to_numpy(obs.state).astype(np.float32)])
    return VLARequest(obs.tenant_id or "", _images(to_numpy(obs.image)), obs.instruction, proprio)


def gradient_job_requests(job: ev.GradientJob) -> list[VLARequest]:
    if job.images is None:
        raise DecodeError("the gradient job has no images; the backbone needs them")
    images = to_numpy(job.images)
    proprio = to_numpy(job.proprio) if job.proprio is not None else np.zeros((len(images), 0), np.float32)
    if not len(images) == len(proprio) == len(job.instructions):
        raise DecodeError(
            f"gradient job {job.batch_id}: {len(images)} images, {len(proprio)} proprio rows, "
            f"{len(job.instructions)} instructions"
        )
    return [
        VLARequest(
            job.tenant_id or "", _images(images[i]), job.instructions[i], proprio[i].astype(np.float32)
        )
        for i in range(len(images))
    ]


def minibatch_rows(job: ev.GradientJob, rows: int) -> list[np.ndarray]:
    """The job's minibatches as row indices (one holding every row when it names none); DecodeError
    for an empty one, an index outside ``[0, rows)`` or a target whose rows do not match."""
    for name, target in job.targets.items():
        if not target.shape or target.shape[0] != rows:
            raise DecodeError(f"gradient job {job.batch_id}: target {name!r} has shape {list(target.shape)}, "
                              f"not {rows} rows")
    if not job.minibatches:
        return [np.arange(rows)]
    out = []
    for j, indices in enumerate(job.minibatches):
        idx = np.asarray(indices, dtype=np.int64)
        if not len(idx) or idx.min() < 0 or idx.max() >= rows:
            raise DecodeError(f"gradient job {job.batch_id}: minibatch {j} is empty or names rows outside "
                              f"[0, {rows})")
        out.append(idx)
    return out


def minibatch_targets(targets: dict[str, ev.Tensor], rows: np.ndarray) -> dict[str, ev.Tensor]:
    """Each target's ``rows``, in that order: the bytes the rollout would have sent for that minibatch."""
    return {name: from_numpy(to_numpy(t)[rows]) for name, t in targets.items()}


def feature_tensors(feature: VLAFeature, needs_sequence: bool) -> dict[str, ev.Tensor]:
    out = {"pooled": feature.pooled, "proprio": feature.proprio, "task_id": feature.task_id}
    if needs_sequence:
        out |= {"sequence": feature.sequence, "attention_mask": feature.attention_mask}
    return {name: from_numpy(t.detach().cpu().numpy()) for name, t in out.items()}


def to_feature(tensors: dict[str, ev.Tensor]) -> VLAFeature:
    try:
        pooled, proprio, task_id = (torch_of(tensors[n]) for n in ("pooled", "proprio", "task_id"))
    except KeyError as exc:
        raise DecodeError(f"feature batch lacks {exc}") from None
    if "sequence" in tensors:
        sequence, mask = torch_of(tensors["sequence"]), torch_of(tensors["attention_mask"])
    else:
        sequence, mask = pooled.unsqueeze(1), torch.ones(pooled.shape[0], 1, dtype=torch.bool)
    return VLAFeature(sequence, mask, pooled, proprio, task_id)


def targets_of(targets: dict[str, ev.Tensor]) -> Targets:
    """PPO targets when the rollout role computed advantages, else SFT action chunks."""
    if "advantages" in targets:
        try:
            return PPOTargets(
                *(torch_of(targets[n]).float() for n in ("actions", "old_log_probs", "advantages", "returns"))
            )
        except KeyError as exc:
            raise DecodeError(f"PPO targets lack {exc}") from None
    if "actions" not in targets:
        raise DecodeError("targets lack 'actions'")
    return SFTTargets(torch_of(targets["actions"]).float())
