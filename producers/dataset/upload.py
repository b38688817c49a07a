"""Install a dataset into the service's datasets root: ``<datasets_root>/<tenant>/<name>/``.

On a confined deployment (a secure broker, or ``datasets_dir`` set) SFT jobs read datasets from
there only (``consumers/master/plan.py: dataset_path``). Installing verifies the dataset first
(every shard's size and sha256 against its ``meta.json``), then copies it beside the target and
renames it into place, so a job never sees half a dataset; an existing name is never replaced.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from infra.tenant_id import validate_tenant_id
from producers.dataset.format import Dataset, DatasetError

__all__ = ["install_dataset"]


def install_dataset(src: str | os.PathLike[str], root: Path, tenant: str, name: str) -> Path:
    """Verify ``src`` and copy it to ``root/<tenant>/<name>``; returns the new directory."""
    validate_tenant_id(tenant)
    if not name or "/" in name or name.startswith(".") or name != Path(name).name:
        raise DatasetError(f"dataset name {name!r}: one path component, not starting with '.'")
    Dataset(src).verify()
    target = root / tenant / name
    if target.exists():
        raise DatasetError(f"{target} exists; choose another name")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".tmp-{uuid.uuid4().hex}"
    try:
        shutil.copytree(src, staging, symlinks=False)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
