"""``joynexus demo``: the paper's scenario, 3 RL tenants + 1 SFT tenant on one shared backbone.

1. the local broker (started if it is not running) and the service as OS processes under the
   process supervisor (as ``joynexus up`` runs it: device host, master, env, optimizer, rollout,
   evaluator, health; each process logs to RUN_DIR/logs/<instance>.log, the demo itself to
   RUN_DIR/demo.log, and ``--verbose`` puts the demo's lines on stderr too);
2. a Reach dataset recorded by the scripted expert (once; kept under JOYNEXUS_HOME/datasets);
3. four jobs at once: PPO on the built-in Reach task (two tenants, different seeds), PPO on
   ManiSkill PushCube-v1, SFT on the dataset, all through Kafka, sharing one backbone;
4. per tenant, an evaluation of its first and its final policy version;
5. a summary table, and a run directory with every job's metrics, the service's numbers and plots.

While it runs the terminal shows one live row per tenant (``demo_board.py``). Ctrl-C or SIGTERM
stops the processes it started and writes where each tenant was to ``RUN_DIR/partial.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from backbone.timeline import group_sizes, read_window
from infra.logging import configure_logging, get_logger
from infra.runtime.demo_board import DemoBoard
from infra.settings import Settings

__all__ = ["run_demo", "scenario"]

log = get_logger("infra.runtime.demo")
EVAL_EPISODES = 24  # per evaluated version: a success rate over fewer means little
# Ctrl-C: what a role has not committed is redone from the log by whoever runs it next, so the
# processes get little time to leave cleanly before they are killed
INTERRUPT_GRACE_S = 3.0


def demo_backbone(settings: Settings, gpu: bool) -> Settings:
    """The backbone the demo runs when none was chosen (``JOYNEXUS_BACKBONE``, .env): the default
    ``small`` on a GPU; ``tiny`` without one, where ``small`` spent 11 minutes on 2 of 10 RL
    iterations and the demo's settings were tuned on ``tiny`` (both are random weights: neither
    sees more than the other in an image)."""
    if gpu or "backbone" in settings.model_fields_set:
        return settings
    return settings.model_copy(update={"backbone": "tiny"})


def scenario(quick: bool, dataset: Path, maniskill: bool = True) -> list[dict[str, Any]]:
    """The four job specs (tenant ids carry a run tag so reruns never collide)."""
    steps = 30
    # Reach with the progress + success reward, measured with benchmarks/ppo_tuning.py (tiny backbone,
    # the demo's seeds 1 / 2, 16 episodes an iteration): held-out success (24 episodes) 0.67 / 0.17
    # after 8 iterations, 0.88 / 0.92 after 20; lr 2e-3 or minibatches of 128 were no steadier.
    # envs=8: an iteration's 16 episodes play in 8 sessions at once, so inference groups fill (the
    # same result as one session: tests/test_service.py).
    rl = {
        "iterations": 8 if quick else 20,
        "episodes_per_iteration": 16,
        "minibatch_size": 64,
        "ppo_epochs": 10,
        "gamma": 0.95,
        "envs": 8,
    }
    reach = {"env_id": "joynexus/Reach-v0", "max_episode_steps": steps}
    specs = [
        {"kind": "rl", "tenant": "reach-a", "seed": 1, "env": reach, "rl": rl, "optim": {"lr": 3e-3}},
        {"kind": "rl", "tenant": "reach-b", "seed": 2, "env": reach, "rl": rl, "optim": {"lr": 3e-3}},
        # SFT on the expert's Reach episodes, with the recorded state beside proprio as the PPO
        # tenants get it: from the tiny backbone's features alone no setting beat 0.17 (a linear
        # probe finds the target in them with R^2 ~0.1). Measured with benchmarks/sft_tuning.py,
        # held-out success on seeds 0 / 1 / 3: 0.79 / 0.71 / 0.71 (full), 0.33 / 0.33 / 0.42 (quick).
        {
            "kind": "sft",
            "tenant": "sft-reach",
            "seed": 3,
            "dataset": {"path": str(dataset), "state_in_proprio": True},
            "sft": {"epochs": 40, "batch_size": 16 if quick else 32, "publish_every": 40 if quick else 50},
            "optim": {"lr": 3e-3},
            "modules": {"hidden": 256},
        },
    ]
    if maniskill:
        push = {"env_id": "PushCube-v1", "max_episode_steps": steps, "image_size": 32}
        specs.append(
            {
                "kind": "rl",
                "tenant": "pushcube",
                "seed": 4,
                "env": push,
                # two sessions: each ManiSkill simulator is a process of its own (kept between
                # iterations by the env worker), and its steps, not inference, bound this tenant
                "rl": {**rl, "iterations": 2 if quick else 4, "episodes_per_iteration": 8, "envs": 2},
                "optim": {"lr": 3e-3},
            }
        )
    return specs


def eval_spec(train: dict[str, Any], version: int, episodes: int, tag: str) -> dict[str, Any]:
    env = train.get("env") or {  # the SFT tenant: the task its demonstrations were recorded on
        "env_id": "joynexus/Reach-v0",
        "obs_mode": "rgb+state",
        "state_in_proprio": True,
        "max_episode_steps": 30,
    }
    return {
        "kind": "eval",
        "tenant": train["tenant"],
        "job_id": f"eval-{tag}-v{version}",
        "seed": 7,
        "env": env,
        "eval": {"policy_version": version, "episodes": episodes},
    }


def ensure_dataset(settings: Settings, quick: bool) -> Path:
    from producers.dataset.generate import generate_dataset

    episodes = 20 if quick else 60
    path = settings.home / "datasets" / f"reach-expert-{episodes}-state"
    if not (path / "meta.json").exists():
        generate_dataset(
            "joynexus/Reach-v0",
            path,
            episodes,
            seed=0,
            obs_mode="rgb+state",
            image_size=32,
            max_episode_steps=30,
            overwrite=True,
            progress=False,
        )
    return path


async def run_demo(settings: Settings, quick: bool = False, maniskill: bool = True,
                   console: Console | None = None, verbose: bool = False) -> dict[str, Any]:
    """The demo, start to summary. Its own log lines go to ``RUN_DIR/demo.log`` (and to stderr with
    ``verbose``), each process's to ``RUN_DIR/logs/<instance>.log``; the terminal shows the board."""
    from infra.runtime.supervisor import ProcessSupervisor
    from producers.client.sdk import Client

    console = console or Console()
    if not console.is_terminal:  # piped to a file: rich would squeeze the tables to 80 columns
        console = Console(file=console.file, width=200)
    # Ctrl-C and SIGTERM cancel the demo; the processes it started are stopped on the way out.
    # Installed here, not left to asyncio.run: a demo started in the background by a
    # non-interactive shell inherits SIGINT ignored, and asyncio.run then installs no handler.
    main = asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, main.cancel)
    tag = datetime.now(UTC).strftime("%m%d%H%M%S")
    run_dir = settings.run_dir / f"demo-{tag}"
    run_dir.mkdir(parents=True, exist_ok=True)
    configure_logging(settings.log_level, settings.log_format, file=run_dir / "demo.log", stderr=verbose)
    console.print(f"run directory: {run_dir}\n  logs: {run_dir / 'demo.log'} and {run_dir / 'logs'}/")
    specs = await _prepare(settings, tag, quick, maniskill, console)
    board = DemoBoard(specs)
    began, began_unix = time.monotonic(), time.time()
    supervisor = ProcessSupervisor(settings)
    supervisor.log_dir = run_dir / "logs"
    grace_s = None
    await supervisor.start()
    submitted: list = []  # every job handle, so that an interrupted demo can cancel its jobs
    try:
        async with Client(settings, requested_by="demo") as client:
            try:
                with console.status("starting the service's processes"):
                    await supervisor.wait_healthy()
                with Live(board, console=console, refresh_per_second=2, redirect_stderr=verbose):
                    states = await _train(client, specs, board, submitted)
                    trained_unix = time.time()
                    waits = _action_waits(supervisor)  # before the evaluations' steps replace them
                    evals = await _evaluate(client, specs, states, EVAL_EPISODES, tag, board, submitted)
                service_stats = _service_stats(supervisor, time.monotonic() - began) | waits
            except asyncio.CancelledError:
                # Left alone, the jobs would resume wherever a master next runs on this broker
                # (the next demo's): the cancel requests go on the log now, confirmed by that master.
                for handle in submitted:
                    with contextlib.suppress(Exception):
                        await client.cancel(handle, reason="the demo was interrupted")
                raise
    except asyncio.CancelledError:
        grace_s = INTERRUPT_GRACE_S
        (run_dir / "partial.json").write_text(json.dumps(board.snapshot(), indent=2))
        console.print(board)
        console.print(f"stopping after {time.monotonic() - began:.0f} s; where each tenant was: "
                      f"{run_dir / 'partial.json'}; its {len(submitted)} jobs are cancelled")
        raise
    finally:
        await supervisor.stop(grace_s)
        # the process's lines back on stderr (a test or a caller goes on after the demo)
        configure_logging(settings.log_level, settings.log_format)
    forwards = read_window(settings.timeline_dir, began_unix, trained_unix)
    service_stats.update(_group_stats(forwards))
    summary = _summary(specs, states, evals, service_stats)
    _write_run(run_dir, summary, states)
    _print_summary(console, summary, run_dir)
    from infra.runtime.report import write_run_report

    console.print(f"report: {write_run_report(run_dir, settings.timeline_dir, began_unix)}")
    return summary


async def _prepare(settings: Settings, tag: str, quick: bool, maniskill: bool,
                   console: Console) -> list[dict[str, Any]]:
    """The broker up, the dataset recorded, the scenario's job specs named for this run (``tag``)
    and every tenant's topics made."""
    from infra.broker import LocalBroker
    from infra.topics import TopicAdmin

    if settings.bootstrap_servers is None:  # the embedded broker, started unless it already runs
        with console.status("starting the local Kafka broker"):
            await asyncio.to_thread(LocalBroker(settings).up)
    with console.status("recording the expert dataset (once)"):
        dataset = await asyncio.to_thread(ensure_dataset, settings, quick)
    specs = scenario(quick, dataset, maniskill)
    for spec in specs:
        spec["tenant"] = f"{spec['tenant']}-{tag}"
        spec["job_id"] = f"train-{tag}"
    async with TopicAdmin(settings) as admin:
        await admin.ensure_shared()
        for spec in specs:  # up front: every new topic set makes the pattern-subscribed groups rebalance
            await admin.ensure_tenant(spec["tenant"])
    return specs


async def _train(client, specs, board: DemoBoard, submitted: list) -> dict:
    handles = []
    for spec in specs:
        handles.append(await client.submit(spec))
        submitted.append(handles[-1])
    results = await asyncio.gather(*(client.follow(h, board.train, timeout_s=3600) for h in handles))
    return dict(zip(handles, results, strict=True))


async def _evaluate(client, specs, states, episodes: int, tag: str, board: DemoBoard,
                    submitted: list) -> dict:
    """The first and the final version of every completed training job, evaluated on its task."""
    jobs = []
    for spec in specs:
        state = next(s for h, s in states.items() if h.tenant == spec["tenant"])
        if state.phase != "completed":
            continue
        first = int(state.resources.get("start_version", "1"))
        for version in sorted({first, state.policy_version}):
            handle = await client.submit(eval_spec(spec, version, episodes, tag))
            submitted.append(handle)
            jobs.append(((spec["tenant"], version), handle))

    async def follow(version: int, handle):
        return await client.follow(handle, lambda state: board.evaluate(state, version), timeout_s=3600)

    results = await asyncio.gather(*(follow(owner[1], handle) for owner, handle in jobs))
    return {owner: result for (owner, _), result in zip(jobs, results, strict=True)}


def _group_stats(forwards) -> dict[str, float]:
    """How full the device's forwards were while the four jobs trained together."""
    out = {}
    for queue in ("inference", "train"):
        for name, value in group_sizes(forwards, queue).items():
            out[f"{queue}_group_{name}"] = value
    return out


def _service_stats(supervisor, wall_s: float) -> dict[str, float]:
    """The device host's own numbers, from its latest heartbeats (it is another process)."""
    book = supervisor.view.book

    def details(role: str) -> dict[str, float]:
        states = book.of_role(role)
        return {k: float(v) for k, v in states[0].details.items()} if states else {}

    inference, train = details("inference"), details("backbone-train")
    gate_wall = max(inference.get("gate_wall_s", 0.0), 1e-9)
    busy_inference, busy_train = inference.get("busy_inference_s", 0.0), inference.get("busy_train_s", 0.0)
    restarts = [e for e in book.restarts if e.host == supervisor.host and e.old_pid is not None]
    return {
        "wall_s": wall_s,
        "processes": float(len(supervisor.instances)),
        "backbone_busy_inference": busy_inference / gate_wall,
        "backbone_busy_train": busy_train / gate_wall,
        "backbone_busy_total": (busy_inference + busy_train) / gate_wall,
        "inference_groups": inference.get("groups", 0.0),
        "inference_mean_group_size": inference.get("mean_group_size", 0.0),
        "inference_mean_group_tenants": inference.get("mean_group_tenants", 0.0),
        # steps inference was asked for again (an env's re-ask, or a session restarted after an env
        # rebalance replaying its episode): answered from its recent answers, no forward
        "inference_repeated_steps": inference.get("repeats", 0.0),
        "train_forwards": train.get("forwards", 0.0),
        "train_mean_group_rows": train.get("mean_group_rows", 0.0),
        # rows the training queue asked for vs rows the backbone computed (the rest came from the
        # feature cache: PPO and SFT epochs repeat their inputs)
        "train_rows_requested": train.get("rows_requested", 0.0),
        "train_rows_forwarded": train.get("rows_forwarded", 0.0),
        "process_restarts": float(len(restarts)),
    }


def _action_waits(supervisor) -> dict[str, float]:
    """How long env steps waited for their action while the jobs trained: the worst env worker's
    p50, p99 and max over its latest steps (each worker's heartbeat keeps 2000), and the steps whose
    action came after the env's 10 s re-ask (each env instance's latest count)."""
    stats = [state.details for state in supervisor.view.book.of_role("env")
             if "action_wait_p50_ms" in state.details]
    if not stats:
        return {}
    out = {f"action_wait_{name}_ms": max(float(d[f"action_wait_{name}_ms"]) for d in stats)
           for name in ("p50", "p99", "max")}
    return out | {"actions_later_than_10s": float(sum(int(d.get("late_actions", 0)) for d in stats))}


def _summary(specs, states, evals, service_stats) -> dict[str, Any]:
    tenants = []
    for spec in specs:
        state = next(s for h, s in states.items() if h.tenant == spec["tenant"])
        history = state.history
        row = {
            "tenant": spec["tenant"],
            "kind": spec["kind"],
            "task": spec.get("env", {}).get("env_id", "dataset"),
            "phase": state.phase,
            "reason": state.reason,
            "policy_version": state.policy_version,
            "steps": state.metrics.get("steps"),
            "final_loss": state.metrics.get("train_loss"),
            "first_return": next((h["mean_return"] for h in history if "mean_return" in h), None),
            "final_return": state.metrics.get("mean_return"),
            "evals": {},
        }
        for (tenant, version), result in evals.items():
            if tenant == spec["tenant"]:
                row["evals"][version] = {"phase": result.phase, **result.metrics}
        tenants.append(row)
    return {"tenants": tenants, "service": service_stats}


def _write_run(run_dir: Path, summary: dict[str, Any], states) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    histories = {
        h.tenant: {"job_id": h.job_id, "phase": s.phase, "history": s.history} for h, s in states.items()
    }
    (run_dir / "jobs.json").write_text(json.dumps(histories, indent=2, default=str))
    evals = {row["tenant"]: row["evals"] for row in summary["tenants"]}
    try:
        _plot(run_dir, histories, evals)
    except Exception as exc:  # a plot is a convenience; the numbers are in the JSON
        log.warning("plotting failed", error=str(exc)[:200])


def _plot(run_dir: Path, histories: dict[str, Any], evals: dict[str, dict[int, dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ret, ax_loss, ax_success) = plt.subplots(1, 3, figsize=(16, 4))
    for tenant, by_version in evals.items():
        versions = sorted(v for v, e in by_version.items() if "success_rate" in e)
        if versions:
            ax_success.plot(versions, [by_version[v]["success_rate"] for v in versions], marker="o",
                            label=tenant)
    for tenant, job in histories.items():
        rows = [h for h in job["history"] if "mean_return" in h and "train_loss" not in h]
        if rows:
            ax_ret.plot(
                [h["iteration"] + 1 for h in rows], [h["mean_return"] for h in rows], marker="o", label=tenant
            )
        losses = [h for h in job["history"] if "train_loss" in h]
        if losses:
            ax_loss.plot(
                [h["steps"] for h in losses], [h["train_loss"] for h in losses], marker=".", label=tenant
            )
    ax_ret.set(title="RL: mean episode return per iteration", xlabel="iteration", ylabel="return")
    ax_loss.set(title="training loss at each published version", xlabel="optimizer step", ylabel="loss")
    ax_success.set(title="evaluation: success rate per evaluated version", xlabel="policy version",
                   ylabel="success rate", ylim=(-0.05, 1.05))
    for ax in (ax_ret, ax_loss, ax_success):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / "curves.png", dpi=120)
    plt.close(fig)


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _print_summary(console: Console, summary: dict[str, Any], run_dir: Path) -> None:
    table = Table(
        "tenant",
        "kind",
        "task",
        "result",
        "steps",
        "final loss",
        "return first->last",
        "eval success (first->final)",
        "eval return (first->final)",
        "versions",
        title="joynexus demo: per tenant",
    )
    for row in summary["tenants"]:
        evals = [row["evals"][v] for v in sorted(row["evals"])]
        success = " -> ".join(_fmt(e.get("success_rate"), 2) for e in evals) or "-"
        ret = " -> ".join(_fmt(e.get("mean_return"), 2) for e in evals) or "-"
        table.add_row(
            row["tenant"],
            row["kind"],
            row["task"],
            row["phase"] + (f" ({row['reason']})" if row["reason"] else ""),
            _fmt(row["steps"], 0),
            _fmt(row["final_loss"], 4),
            f"{_fmt(row['first_return'], 2)} -> {_fmt(row['final_return'], 2)}",
            success,
            ret,
            _fmt(row["policy_version"]),
        )
    console.print(table)
    service = Table("service", "value", title="joynexus demo: shared backbone")
    for name, value in summary["service"].items():
        service.add_row(name, _fmt(value))
    console.print(service)
    console.print(f"run directory: {run_dir} (summary.json, jobs.json, curves.png)")
