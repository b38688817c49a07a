"""CPU affinity of supervised processes (``cpu_affinity``, ``joynexus up --cpus``): the plan is
parsed and checked, and a real child pins itself, again after it is killed and restarted."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from infra.errors import JoynexusError
from infra.runtime.affinity import cpus_for
from infra.runtime.supervisor import ProcessSupervisor, parse_cpus
from infra.settings import Settings
from tests.helpers import wait_for


def test_cpus_plan_is_parsed_and_checked() -> None:
    plan = parse_cpus("device=0, rest=0-1")
    assert plan == {"device": [0], "rest": [0, 1]}
    assert parse_cpus("env=0+1") == {"env": [0, 1]}
    assert cpus_for(plan, "device") == [0] and cpus_for(plan, "health") == [0, 1]
    assert cpus_for({"device": [0]}, "env") is None  # neither named nor covered by rest: not pinned
    for bad in ("devise=0", "device=", "device=1-0", "device=x", f"device={os.cpu_count()}"):
        with pytest.raises(JoynexusError):
            parse_cpus(bad)
    with pytest.raises(ValueError):
        Settings(cpu_affinity={"device": []}, _env_file=None)


def _cpus_of_every_thread(pid: int) -> set[frozenset[int]]:
    masks = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            masks.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    return masks


@pytest.mark.broker
async def test_a_child_pins_itself_and_keeps_its_cpus_after_a_restart(settings: Settings,
                                                                       tmp_path: Path) -> None:
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("needs two CPUs: pinning to the only one changes nothing")
    target = frozenset(mine[-1:])
    local = settings.model_copy(update={"home": tmp_path / "home",
                                        "cpu_affinity": {"health": sorted(target)}})
    async with ProcessSupervisor(local, ("health",), autoscale=False) as supervisor:
        (inst,) = supervisor.instances
        first = inst.pid
        await wait_for(lambda: _cpus_of_every_thread(first) == {target}, timeout_s=120,
                       what="the health process pinned, every thread")
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: inst.alive and inst.pid != first, timeout_s=60, what="the restart")
        again = inst.pid
        await wait_for(lambda: _cpus_of_every_thread(again) == {target}, timeout_s=120,
                       what="the restarted health process pinned")
    assert frozenset(os.sched_getaffinity(0)) == frozenset(mine)  # the supervisor itself is not pinned
