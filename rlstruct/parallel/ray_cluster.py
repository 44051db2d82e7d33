"""Ray for rlstruct: the one module that imports it, and the connection every Ray user of the
process shares (``RayBatcher`` and the Ray learner ranks).

The connection is a local cluster rlstruct starts, or a running one it joins; it is shared by
every live user of the process and closed by the last one that opened it. ``ray.init`` replaces
the process's SIGTERM handler with ``sys.exit``; the handlers found before it are put back
(a run's own, which writes its final checkpoint: :mod:`rlstruct.runs.signals`).
Without Ray installed this module still imports: its ``ray`` and :data:`SESSION` are None and
:func:`require_ray` raises an ImportError that says how to install the ``ray`` extra. Ray
itself is not a public name here (not in ``__all__``): :func:`require_ray` returns it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from rlstruct.errors import ConfigError, install_hint

try:
    import ray
    import ray.exceptions
except ImportError as _import_error:  # the extra is not installed: require_ray() says so
    ray = None
    RAY_IMPORT_ERROR: ImportError | None = _import_error
else:
    RAY_IMPORT_ERROR = None


def require_ray(what: str) -> Any:
    """The ``ray`` module.

    Args:
        what: who needs it, for the message (``"RayBatcher"``).

    Raises:
        ImportError: Ray is not installed, or does not import (the reason is given).
    """
    if ray is None:
        raise ImportError(f"{what} needs Ray, an optional extra: {install_hint('ray')} "
                          f"({RAY_IMPORT_ERROR})", name="ray") from RAY_IMPORT_ERROR
    return ray


def connect_advice(address: str, err: BaseException) -> str:
    """What to say when joining the Ray cluster at ``address`` failed with ``err``: the cause in
    one line, and what to do about it.

    Examples:
        >>> advice = connect_advice("10.0.0.1:6379", RuntimeError("InvalidAuthToken: ..."))
        >>> advice.startswith("cannot join the Ray cluster at 10.0.0.1:6379")
        True
        >>> "export RAY_AUTH_MODE=token" in advice
        True
    """
    first = (str(err).strip().splitlines() or [""])[0][:300]
    text = f"{type(err).__name__}: {first}"
    if "auth" in text.lower() or "token" in text.lower():
        todo = ("the cluster uses token authentication: export RAY_AUTH_MODE=token in the "
                "driver's environment (and on every node that runs `ray start`), with the "
                "cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN; docs/guide-clusters.md")
    else:
        todo = ("check that `ray start --head` runs there and that this machine can reach it "
                "(`ray status --address ADDRESS`), that both run the same Ray and Python "
                "versions, or leave --ray-address out to start a local cluster; "
                "docs/guide-clusters.md")
    return f"cannot join the Ray cluster at {address} ({text}): {todo}"


@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Puts back the SIGTERM and SIGINT handlers of the main thread after the block
    (``ray.init`` installs ``sys.exit(signum)`` on SIGTERM, which would end a run without its
    final checkpoint)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)


def _ray_constants() -> Any:
    """``ray._private.ray_constants``, where this Ray version has it."""
    with contextlib.suppress(ImportError):
        from ray._private import ray_constants

        return ray_constants
    return None

__all__ = ["RaySession", "LOCAL_ENV", "SESSION", "require_ray", "connect_advice",
           "keep_signal_handlers"]

#: Environment variables set while RayBatcher starts a local cluster: no usage statistics, and
#: Ray's "local only" mode, in which every Ray process binds to the loopback address.
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class RaySession:
    """The connection RayBatchers opened themselves: how many live batchers use it, and whether
    it is a local cluster they started or a connection to a running cluster.

    Args:
        ray: the ``ray`` module.
        constants: returns ``ray._private.ray_constants`` (None where it cannot be imported).
    """

    def __init__(self, ray: Any, constants: Callable[[], Any]) -> None:
        self.ray = ray
        self._constants = constants
        self.users = 0
        self.local = False

    def _init_local(self, num_cpus: int) -> None:
        """Starts a local Ray cluster bound to the loopback address, without dashboard or usage
        statistics (the environment is restored afterwards; the cluster keeps its settings)."""
        saved_env = {k: os.environ.get(k) for k in LOCAL_ENV}
        os.environ.update(LOCAL_ENV)
        # The Ray processes started below read the variables; this process read them when it
        # imported ray, so its flag is switched too (Ray resolves 127.0.0.1 to the machine's
        # address unless it runs in local-only mode).
        constants = self._constants()
        flag = getattr(constants, "ENABLE_RAY_CLUSTER", None)
        try:
            if flag is not None:
                constants.ENABLE_RAY_CLUSTER = False
            self.ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=True,
            )
        finally:
            if flag is not None:
                constants.ENABLE_RAY_CLUSTER = flag
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def acquire(self, address: str | None, num_cpus: int) -> bool:
        """Makes sure this process is connected to Ray; True when a RayBatcher owns the
        connection (then the last RayBatcher to close calls ``ray.shutdown``).

        Args:
            address: ``None`` (``RAY_ADDRESS``, else a local cluster), ``"local"``, or the
                address of a running cluster; ignored when this process is connected already.
            num_cpus: the CPUs of a local cluster.

        Raises:
            ConfigError: the cluster at ``address`` cannot be joined (one message that says
                what to do; see :func:`connect_advice`).
        """
        if self.ray.is_initialized():
            if self.users > 0:  # opened by another RayBatcher that is still alive
                self.users += 1
                return True
            return False  # the caller's own Ray session: never shut down
        self.users = 0
        if address is None:
            address = os.environ.get("RAY_ADDRESS") or "local"
        if address == "local":
            with keep_signal_handlers():
                self._init_local(num_cpus)
        else:
            try:
                with keep_signal_handlers():
                    self.ray.init(address=address)
            except Exception as err:  # noqa: BLE001 - refused, bad token, version...: a ConfigError
                raise ConfigError(connect_advice(address, err)) from None
        self.users, self.local = 1, address == "local"
        return True

    def check_room(self, n_actors: int, num_cpus: float, num_gpus: float) -> None:
        """On a local cluster a RayBatcher started (it cannot grow), actors that could never be
        placed are a ConfigError now rather than a start timeout later.

        Raises:
            ConfigError: naming the resource, what the actors need and what the cluster has.
        """
        if not self.local:
            return
        total = self.ray.cluster_resources()
        short = [
            f"{need:g} {kind} ({n_actors} x {each:g}), the local cluster has "
            f"{total.get(kind, 0):g}"
            for kind, each in (("CPU", num_cpus), ("GPU", num_gpus))
            if (need := n_actors * each) > total.get(kind, 0) + 1e-9
        ]
        if short:
            raise ConfigError(
                "the actors cannot be placed: they need " + "; ".join(short) + " (for GPUs, "
                "start Ray on a machine that has them, or connect to a cluster with address=...)"
            )

    def release(self) -> None:
        """One RayBatcher that owned the connection is done; the last one shuts Ray down (a
        local cluster it started stops; a connection to a running cluster is closed, the
        cluster runs on)."""
        if self.users <= 0:
            return
        self.users -= 1
        if self.users == 0 and self.ray.is_initialized():
            with contextlib.suppress(Exception):  # a cluster gone already: nothing to shut down
                self.ray.shutdown()

    def kill(self, actors: list[Any], grace: float) -> None:
        """Asks every actor to close its envs and agent (up to ``grace`` seconds), then kills
        it; empties ``actors``."""
        ray = self.ray
        if not ray.is_initialized():
            actors.clear()
            return
        refs = []
        if grace > 0:
            for actor in actors:
                with contextlib.suppress(Exception):  # a dead actor: killed below anyway
                    refs.append(actor.close.remote())
        if refs:
            with contextlib.suppress(Exception):  # actors that do not close are killed next
                ray.wait(refs, num_returns=len(refs), timeout=grace)
        for actor in actors:
            with contextlib.suppress(Exception):  # an actor that is dead already
                ray.kill(actor, no_restart=True)
        actors.clear()

    def finalize(self, actors: list[Any], owns: bool) -> None:
        """Run by ``close`` or when a batcher is garbage collected: kills what is left of its
        actors, releases the connection it owned."""
        with contextlib.suppress(Exception):  # a finalizer must not raise (garbage collection)
            self.kill(actors, grace=0.0)
        if owns:
            self.release()


#: The Ray connection rlstruct opened itself (None without Ray).
SESSION = RaySession(ray, _ray_constants) if ray is not None else None
