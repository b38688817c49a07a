"""CPU affinity of a supervised process: which cores a process kind may run on (``cpu_affinity``).

``joynexus up --cpus device=0,rest=1`` (or ``JOYNEXUS_CPU_AFFINITY``) gives the device host a
core of its own and every other process the rest, so on a CPU machine the device host's busy
time is the "device's", as on a GPU machine, and not time lost to simulators stepping on the
same core. Each child pins itself first thing at start (``joynexus run`` / ``joynexus
metering``), so a restarted process keeps its cores, and so does anything it starts later
(threads and child processes inherit the mask).

Only the standard library: the CLI calls this before importing torch or Kafka clients.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence

from infra.errors import JoynexusError
from infra.logging import get_logger

__all__ = ["REST", "cpus_for", "pin_process"]

log = get_logger("infra.runtime.affinity")

#: The key of ``cpu_affinity`` that covers every process kind not named.
REST = "rest"


def cpus_for(affinity: Mapping[str, Sequence[int]], kind: str) -> list[int] | None:
    """The CPUs of ``kind`` (its own entry, else ``rest``); None: not pinned."""
    cpus = affinity.get(kind, affinity.get(REST))
    return sorted(set(cpus)) if cpus else None


def pin_process(affinity: Mapping[str, Sequence[int]], kind: str) -> set[int] | None:
    """Pins every thread of this process to the CPUs of ``kind``; returns the mask now in force.

    sched_setaffinity(0) moves only the calling thread, so each thread that already exists (a
    library may have started one at import) is moved too; threads started later inherit."""
    cpus = cpus_for(affinity, kind)
    if cpus is None:
        return None
    try:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cpus)
    except OSError as exc:
        raise JoynexusError(f"cannot pin process kind {kind!r} to CPUs {cpus}: {exc}") from exc
    now = os.sched_getaffinity(0)
    if now != set(cpus):  # the kernel drops CPUs outside this machine's cpuset
        log.warning("cpu affinity narrower than asked", kind=kind, asked=cpus, cpus=sorted(now))
    else:
        log.info("cpu affinity set", kind=kind, cpus=sorted(now))
    return now
