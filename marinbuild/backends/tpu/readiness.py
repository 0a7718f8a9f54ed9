"""Created slices' hosts after ACTIVE: waiting until every worker can be logged into.

A queued resource turns ACTIVE when its VMs exist, minutes before they can be used: sshd
starts late, the ``ssh-keys`` user is made after that, and the guest agent writes the host
keys (guest attributes) later still. Until ``[gcp] ssh_ready_timeout`` (default 600 s) after
ACTIVE, a refused connection, a failed login or a missing host key is the VM still booting,
and is asked again; only after it is an SSH failure judged (by the gang, as for any host)::

    slices = wait_reachable(api, slices, ssh_settings, deadline, cancel, say=print)

A host presenting a key other than the one the API reports is not waited for: it answered,
and the gang refuses it at once (``INFRA``, not retried), as it refuses such a host anywhere.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from marinbuild.backends.tpu.cluster import SliceSpec
from marinbuild.backends.tpu.ssh import HostKeyError, HostUnknown, SshConnection, SshError, resolve_target
from marinbuild.backends.tpu.tpu_api import TpuApi, TpuApiError

__all__ = ["Probe", "ReadyProbe", "ssh_login", "wait_reachable"]

_ASK_EVERY_S = 5.0
"""How often hosts not yet reachable are asked again on Google's API (an emulator: 0.2 s)."""


@dataclasses.dataclass(frozen=True)
class ReadyProbe:
    """Where the wait stands: hosts reachable of all, and what the others last said."""

    reachable: int
    total: int
    waiting_on: tuple[str, ...]
    """``HOST: why`` for each host not reachable yet."""

    @property
    def text(self) -> str:
        """``booting: 2/4 hosts reachable`` (what ``status`` shows)."""
        return f"booting: {self.reachable}/{self.total} hosts reachable"


def _keys_of(api: TpuApi, spec: SliceSpec, hosts: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    reported = api.host_keys(spec.name)
    return {h: keys for h, keys in zip(hosts, reported, strict=False) if keys}


Probe = Callable[[str, SliceSpec, tuple[str, ...]], "str | None"]
"""``(SSH entry, its slice, its reported keys)`` -> None when the host is ready, else why not yet."""


def ssh_login(entry: str, spec: SliceSpec, keys: tuple[str, ...]) -> str | None:
    """None when ``entry`` accepts the login with one of ``keys``, or fails in a way no wait helps
    (a differing host key, a name that does not resolve: the gang judges those); else why not yet."""
    target = dataclasses.replace(resolve_target(entry, spec.ssh), trusted_host_keys=keys)
    try:
        SshConnection.connect(target).close()
    except (HostKeyError, HostUnknown):
        return None
    except SshError as e:
        text = str(e)
        return text[len(e.host) + 2:] if text.startswith(f"{e.host}: ") else text
    return None


def _ask(probe: Probe, entry: str, spec: SliceSpec, keys: tuple[str, ...]) -> str | None:
    if not keys:
        return "no host key reported yet"
    return probe(entry, spec, keys)


def wait_reachable(
    api: TpuApi,
    specs: tuple[SliceSpec, ...],
    keys: dict[str, tuple[str, ...]],
    deadline: float,
    cancel: threading.Event,
    *,
    on_probe: Callable[[ReadyProbe], None] = lambda probe: None,
    probe: Probe = ssh_login,
    poll: float = _ASK_EVERY_S,
    max_parallel: int = 32,
    clock: Callable[[], float] = time.time,
) -> ReadyProbe:
    """Ask every host until each has its keys reported and accepts the login, ``deadline`` passes
    or ``cancel`` is set; ``keys`` (SSH entry -> reported keys) is filled in as they arrive.

    Returns the last probe (all reachable, or not by the deadline: the gang then judges the
    hosts as it judges any).
    """
    entries = [(h, s) for s in specs for h in s.hosts]
    ready: set[str] = set()
    last = ReadyProbe(0, len(entries), ())
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(entries)))) as pool:
        while True:
            for s in specs:
                if any(h not in keys for h in s.hosts):
                    try:
                        keys.update(_keys_of(api, s, s.hosts))
                    except TpuApiError as e:
                        if not e.transient:
                            raise
            todo = [(h, s) for h, s in entries if h not in ready]
            answers = list(pool.map(lambda hs: (hs[0], _ask(probe, hs[0], hs[1], keys.get(hs[0], ()))), todo))
            ready.update(h for h, why in answers if why is None)
            last = ReadyProbe(len(ready), len(entries), tuple(f"{h}: {why}" for h, why in answers if why is not None))
            on_probe(last)
            if len(ready) == len(entries) or clock() >= deadline:
                return last
            if cancel.wait(min(poll, max(0.0, deadline - clock()))):
                return last
