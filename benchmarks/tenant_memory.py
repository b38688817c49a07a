"""What one tenant costs in memory, next to the shared backbone it rides on.

    python benchmarks/tenant_memory.py [--presets small gpu-1b gpu-2b gpu-4b] [--device cpu|cuda]
                                       [--json PATH]

For each backbone preset (``backbone.presets``): the backbone's parameter count,
sized on the meta device (nothing is allocated or downloaded), and its weight
bytes in the dtype it runs in (fp32 on CPU for ``small``, bf16 on a GPU for the
``gpu-*`` presets). Next to it, real tenant slots at that preset's hidden size,
built on the CPU and stepped once so that gradients and AdamW state exist:

* head-only slots: the OFT-style chunk regression head at widths 256 and 1024,
  and the Gaussian actor-critic (PPO) head at width 256;
* policy-suffix slots: one transformer block at the backbone's width with LoRA
  rank 8, 16 and 32 on all its linears, plus a 256-wide head; and one 256-wide
  block (rank 16) behind an input projection.

Slot bytes are fp32 and measured with ``TenantSlot.memory()``: all parameters
(the suffix's frozen base included), allocated gradients, optimizer state.
The suffix's frozen base is one copy per process shared by every slot
(``tenants/shared_base.py``), so "extra tenant" is what one more tenant with
that slot costs once the first one is there: the slot without the shared base.
With ``--device cuda`` the extra tenant is also measured on the device by the
allocator: ``torch.cuda.memory_allocated`` after a second slot of the same
configuration was built, mounted and stepped, minus before (resident), and
``torch.cuda.max_memory_allocated`` during that (peak, activations included).
"slots per backbone" is how many such slots fit in the memory of one more
backbone copy, i.e. what isolated per-tenant runs would pay per tenant.
Activations are not counted (they depend on batch and sequence length).
Prints a markdown table; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from backbone.feature import VLAFeature
from backbone.presets import get_preset, hf_config
from tenants.config import HeadConfig, SuffixConfig, TenantConfig
from tenants.slot import TenantSlot
from tenants.targets import PPOTargets, SFTTargets

MiB = 1024 * 1024
ACTION_DIM, CHUNK, PROPRIO = 7, 8, 8  # a 7-DoF arm, 8-step chunks (OpenVLA-OFT's LIBERO setting)


@dataclass(frozen=True)
class Row:
    preset: str
    backbone_params: int
    backbone_dtype: str
    backbone_bytes: int
    hidden_size: int
    slot: str
    trainable_params: int
    frozen_params: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    slot_bytes: int
    shared_base_bytes: int = 0  # the part of param_bytes that is the process's shared suffix base
    extra_tenant_bytes: int = 0  # slot_bytes without the shared base: one more such tenant
    device: str = "cpu"
    device_resident_bytes: int | None = None  # cuda: allocator bytes one more slot holds after a step
    device_peak_bytes: int | None = None  # cuda: allocator peak while building and stepping it

    @property
    def ratio(self) -> float:
        return self.slot_bytes / self.backbone_bytes


def backbone_size(name: str) -> tuple[int, int]:
    """(parameters, hidden size of the features) of a preset, built on the meta device."""
    from transformers import AutoModelForImageTextToText

    config = hf_config(get_preset(name))
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    return sum(p.numel() for p in model.parameters()), config.get_text_config().hidden_size


def slot_variants(hidden: int) -> dict[str, TenantConfig]:
    def config(head: HeadConfig, suffix: SuffixConfig | None = None) -> TenantConfig:
        return TenantConfig("bench", hidden, head=head, suffix=suffix)

    def head(kind: str = "chunk_regression", width: int = 256) -> HeadConfig:
        return HeadConfig(kind=kind, action_dim=ACTION_DIM, chunk_len=CHUNK, proprio_dim=PROPRIO,
                          hidden=width)

    heads = 16 if hidden % 16 == 0 else 8
    return {
        "chunk head 256": config(head()),
        "chunk head 1024": config(head(width=1024)),
        "PPO actor-critic 256": config(head("gaussian_actor_critic")),
        **{f"suffix LoRA r{r} + head 256": config(head(), SuffixConfig(num_heads=heads, lora_rank=r))
           for r in (8, 16, 32)},
        # the width knob: a 256-wide suffix behind a (frozen, LoRA-adapted) input projection
        "suffix w256 LoRA r16 + head 256": config(head(), SuffixConfig(width=256, num_heads=4, lora_rank=16)),
    }


def measure_slot(config: TenantConfig, device: str = "cpu") -> TenantSlot:
    """A slot after one step of its objective on a tiny batch: gradients and AdamW state are allocated.

    (A PPO head must take a PPO step: an SFT step leaves its critic without gradients or AdamW state.)
    """
    gen = torch.Generator().manual_seed(0)
    b, t, h = 2, 4, config.hidden_size
    sequence = torch.randn(b, t, h, generator=gen)
    feature = VLAFeature(sequence, torch.ones(b, t, dtype=torch.bool), sequence.mean(1),
                         torch.randn(b, PROPRIO, generator=gen), torch.zeros(b, dtype=torch.long))
    slot = TenantSlot(config).mount(device)
    if config.head.kind == "gaussian_actor_critic":
        out = slot.act(feature)
        advantages, returns = torch.randn(b, generator=gen), torch.randn(b, generator=gen)
        targets = PPOTargets(out.action, out.log_prob, advantages, returns)
    else:
        targets = SFTTargets(torch.randn(b, CHUNK, ACTION_DIM, generator=gen))
    slot.train_step(feature, targets)
    return slot


def device_extra_tenant(config: TenantConfig, device: torch.device) -> tuple[int, int]:
    """(resident, peak) allocator bytes of one more slot on ``device``, the first one already there."""
    first = measure_slot(config, str(device))  # also puts the shared suffix base on the device
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    second = measure_slot(replace(config, tenant_id="bench-two", seed=config.seed + 1), str(device))
    torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device) - before
    peak = torch.cuda.max_memory_allocated(device) - before
    del first, second
    torch.cuda.empty_cache()
    return resident, peak


def rows_for(preset: str, device: str = "cpu") -> list[Row]:
    params, hidden = backbone_size(preset)
    # the dtype Backbone.load picks: bf16 on a GPU, fp32 on the CPU
    dtype = torch.bfloat16 if preset.startswith("gpu") else torch.float32
    backbone_bytes = params * dtype.itemsize
    rows = []
    dev = torch.device(device)
    for name, config in slot_variants(hidden).items():
        slot = measure_slot(config)
        memory = slot.memory()
        trainable = sum(p.numel() for p in slot.policy.parameters() if p.requires_grad)
        frozen = sum(p.numel() for p in slot.policy.parameters() if not p.requires_grad)
        resident = peak = None
        if dev.type == "cuda":
            resident, peak = device_extra_tenant(config, dev)
        rows.append(Row(preset, params, str(dtype).removeprefix("torch."), backbone_bytes, hidden, name,
                        trainable, frozen, memory.param_bytes, memory.grad_bytes, memory.optimizer_bytes,
                        memory.total_bytes, memory.shared_param_bytes, memory.own_bytes, str(dev),
                        resident, peak))
        del slot
    return rows


def markdown(rows: list[Row]) -> str:
    lines = [
        "| backbone | params | weights MiB | H | tenant slot | trainable | frozen | params MiB | grads MiB "
        "| AdamW MiB | slot MiB | shared base MiB | extra tenant MiB | on device: resident / peak MiB "
        "| slot / backbone | slots per backbone |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        measured = ("-" if r.device_resident_bytes is None
                    else f"{r.device_resident_bytes / MiB:.2f} / {r.device_peak_bytes / MiB:.2f}")
        lines.append(
            f"| {r.preset} | {r.backbone_params / 1e6:,.1f}M "
            f"| {r.backbone_bytes / MiB:,.1f} ({r.backbone_dtype}) "
            f"| {r.hidden_size} | {r.slot} | {r.trainable_params / 1e6:.3f}M | {r.frozen_params / 1e6:.3f}M "
            f"| {r.param_bytes / MiB:.2f} | {r.grad_bytes / MiB:.2f} | {r.optimizer_bytes / MiB:.2f} "
            f"| {r.slot_bytes / MiB:.2f} | {r.shared_base_bytes / MiB:.2f} "
            f"| {r.extra_tenant_bytes / MiB:.2f} "
            f"| {measured} | {100 * r.ratio:.2f}% | {int(1 / r.ratio):,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["small", "gpu-1b", "gpu-2b", "gpu-4b"])
    parser.add_argument("--device", default="cpu",
                        help="cuda: also measure one more tenant with the device's allocator")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [row for preset in args.presets for row in rows_for(preset, args.device)]
    print(markdown(rows))
    for r in rows:
        if r.slot == "suffix LoRA r16 + head 256":
            print(f"{r.preset}: one more tenant with suffix LoRA r16 + head + AdamW costs "
                  f"{r.extra_tenant_bytes / MiB:.2f} MiB (target <= 16 MiB); the shared frozen base, "
                  f"{r.shared_base_bytes / MiB:.2f} MiB, is paid once per process")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
