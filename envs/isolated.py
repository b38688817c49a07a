"""A simulator in a child process, so a crash, a hang or a leak costs only that process.

A simulator that segfaults (native physics and rendering code can) takes its
process with it, and a hung call cannot be interrupted from Python. The env
role therefore may run each session's simulator as an ``IsolatedSimulator``:
``make_simulator`` in a spawned child, every call answered within a deadline.
A call that times out kills the child; a child that died is reported with its
exit code. Both raise ``SimulatorError``, after which the object is dead and
the session makes a new one. ``InvalidAction`` and ``ConfigError`` come back
as themselves (the simulator is fine).

The child is a fresh interpreter (``subprocess``, not ``multiprocessing``:
spawning through multiprocessing re-imports the caller's ``__main__``, which
fails in scripts without a main guard) talking pickled messages over a
socket pair.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from envs.base import InvalidAction, SimObs, SimSpec, SimStep, SimulatorError
from infra.errors import ConfigError
from infra.logging import get_logger

__all__ = ["IsolatedSimulator"]

log = get_logger("envs.isolated")

_PASSED_THROUGH = {"InvalidAction": InvalidAction, "ConfigError": ConfigError}


_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding the consumers package
_CHILD = "import sys; from envs.isolated import serve; serve(int(sys.argv[1]))"


def serve(fd: int) -> None:
    """The child: receive (env_id, make_kwargs), make the simulator, answer requests until "close"/EOF."""
    from envs.registry import make_simulator

    conn = Connection(fd)
    env_id, make_kwargs = conn.recv()
    try:
        sim = make_simulator(env_id, **make_kwargs)
    except Exception as exc:
        conn.send(("error", type(exc).__name__, f"{exc}\n{traceback.format_exc(limit=5)}"))
        return
    conn.send(("ok", sim.spec))
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):
            break
        if op == "close":
            sim.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(sim, op)(*args)))
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))


class IsolatedSimulator:
    """``make_simulator(env_id, **make_kwargs)`` in a spawned process; each call within ``timeout_s``."""

    def __init__(self, env_id: str, *, timeout_s: float = 60.0, start_timeout_s: float = 300.0,
                 **make_kwargs: Any):
        self.env_id, self.timeout_s = env_id, timeout_s
        ours, theirs = socket.socketpair()
        path = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(theirs.fileno())],
                                      pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._dead: str | None = None
        self._conn.send((env_id, make_kwargs))
        self.spec: SimSpec = self._wait(start_timeout_s, "start")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def reset(self, seed: int) -> SimObs:
        return self._call("reset", seed)

    def step(self, action: Any) -> SimStep:
        return self._call("step", action)

    def privileged(self) -> dict[str, Any]:
        return self._call("privileged")

    def close(self) -> None:
        if self._dead is None:
            try:
                self._call("close", timeout_s=min(self.timeout_s, 10.0))
            except SimulatorError as exc:
                log.warning("isolated simulator did not close cleanly", env_id=self.env_id, error=str(exc))
        self._dead = self._dead or "closed"
        self._stop()
        self._conn.close()

    def _stop(self) -> None:
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)

    def _call(self, op: str, *args: Any, timeout_s: float | None = None) -> Any:
        if self._dead is not None:
            raise SimulatorError(f"{self.env_id}: the simulator process is gone ({self._dead}); "
                                 "make a new one")
        try:
            self._conn.send((op, args))
        except (OSError, ValueError) as exc:  # the pipe broke: the child is gone
            raise self._died(f"{op} could not be sent") from exc
        return self._wait(timeout_s or self.timeout_s, op)

    def _wait(self, timeout_s: float, op: str) -> Any:
        if not self._conn.poll(timeout_s):
            self._proc.kill()
            self._proc.wait(timeout=5)
            self._dead = f"{op} timed out after {timeout_s:g} s; killed"
            raise SimulatorError(f"{self.env_id}: {self._dead}")
        try:
            reply = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died(f"no answer to {op}") from exc
        if reply[0] == "ok":
            return reply[1]
        _, kind, message = reply
        if kind in _PASSED_THROUGH:
            raise _PASSED_THROUGH[kind](message)
        if op == "start":
            self._dead = "failed to start"
        raise SimulatorError(f"{self.env_id}: {op} failed in the simulator process: {kind}: {message}")

    def _died(self, what: str) -> SimulatorError:
        self._stop()
        self._dead = f"process exited with code {self._proc.returncode}"
        return SimulatorError(f"{self.env_id}: {what}: {self._dead}")
