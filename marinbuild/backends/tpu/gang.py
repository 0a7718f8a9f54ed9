"""One attempt of a command on every host of a gang: launch, stream logs, tear down, check.

A gang lives or dies as one: the first host whose command exits non-zero or whose
connection drops makes every other host's process group be killed at once, from a
second channel or a fresh connection, without waiting for JAX's own timeouts.  Afterwards
each host is asked, over SSH, whether anything of the attempt survived and whether GCE
says it was preempted.  With a ``progress_timeout``, a gang whose hosts all stay silent (no
log line from any host, no change to any host's ``$MARINBUILD_PROGRESS`` file) for that
long is torn down the same way, as a hang::

    outcome = Gang(plans, command="python train.py", logs=AttemptLogs(out, tmp)).run()
    outcome.classification   # Cause.SUCCESS, .PREEMPTED, .HANG, ...
"""

from __future__ import annotations

import math
import queue
import shlex
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

import paramiko

from marinbuild.backends.base import PROGRESS_VAR
from marinbuild.backends.deadlines import Deadline, deadlines
from marinbuild.backends.progress import ProgressClock, poll_interval
from marinbuild.backends.tpu.attempt_logs import AttemptLogs
from marinbuild.backends.tpu.cluster import SshSettings
from marinbuild.backends.tpu.gang_outcome import GangOutcome, HostOutcome
from marinbuild.backends.tpu.preemption import (
    metadata_query_command,
    parse_metadata_answer,
)
from marinbuild.backends.tpu.ssh import (
    CommandResult,
    ConnectionLost,
    HostKeyError,
    HostTarget,
    HostUnknown,
    HostUnreachable,
    SshAuthError,
    SshConnection,
    SshError,
    export_env,
    remote_path,
)
from marinbuild.backends.tpu.workdir_sync import PackedWorkdir, WorkdirSyncError, presence_check, upload_and_unpack

__all__ = ["TOKEN_VAR", "Gang", "HostPlan"]

# Every process of an attempt inherits this variable; finding it in /proc/*/environ
# catches processes that left the process group (a daemon, a second setsid).
TOKEN_VAR = "MARINBUILD_GANG_TOKEN"
_MAX_LINE = 65536
_HYGIENE_TIMEOUT_S = 60
_READER_JOIN_S = 5.0
# Beyond the kill grace: the final wait for SIGKILLed processes and the metadata query.
_TEARDOWN_SLACK_S = 15.0


@dataclass(frozen=True)
class HostPlan:
    """One host's part in an attempt: where it sits in the gang and its environment."""

    slice_name: str
    slice_index: int
    worker_index: int
    entry: str
    target: HostTarget
    settings: SshSettings
    env: Mapping[str, str]


@dataclass
class _HostState:
    plan: HostPlan
    conn: SshConnection | None = None
    chan: paramiko.Channel | None = None
    remote_root: str | None = None
    launch_sent: bool = False
    exit_code: int | None = None
    connection_lost: bool = False
    reachable: bool | None = None
    metadata_preempted: bool | None = None
    infra_error: str | None = None
    survivors: tuple[int, ...] = ()
    synced: bool = False
    connected: bool = False
    note: str | None = None
    fatal: bool = False
    torn_down: bool = False
    answered_before: bool = False
    reader: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def attempt_dir(self) -> str:
        """A shell word for this host's attempt directory (it may start with ``"$HOME"``)."""
        root = remote_path(self.plan.settings.remote_workdir)
        return f"{root}/attempts/{shlex.quote(self.plan.env[TOKEN_VAR])}"

    def outcome(self) -> HostOutcome:
        p = self.plan
        return HostOutcome(
            p.entry, p.slice_index, p.worker_index, self.exit_code, self.connection_lost,
            self.reachable, self.metadata_preempted, self.infra_error, self.survivors,
            self.note, self.fatal, self.torn_down,
            unreached=self.reachable is False and not self.connected,
            answered_before=self.answered_before,
            answered=self.connected,
        )


class Gang:
    """Run ``command`` once on every host of ``plans`` and report what happened.

    ``plans[i].env`` must hold :data:`TOKEN_VAR`, unique per host and attempt.  Lines from
    the first plan's host (slice 0, worker 0) also go to ``console``.  ``secrets`` are
    blanked out of logs and console lines.  ``lease_of`` is the step's output path: each
    host kills the command once the deadline published for it there
    (:mod:`marinbuild.backends.deadlines`) passes without a renewal reaching the host.
    """

    def __init__(
        self,
        plans: Sequence[HostPlan],
        *,
        command: str,
        logs: AttemptLogs,
        workdir: PackedWorkdir | None = None,
        console: Callable[[str], None] = lambda line: None,
        console_prefix: str = "",
        cancel: threading.Event | None = None,
        max_parallel: int = 32,
        secrets: Sequence[str] = (),
        log_header: str = "",
        answered_before: Collection[str] = (),
        lease_of: str | None = None,
        progress_timeout: float | None = None,
        on_moved: Callable[[float], None] | None = None,
    ) -> None:
        self.hosts = [_HostState(p, answered_before=p.entry in answered_before) for p in plans]
        self.lease_of = lease_of
        self.command = command
        self.logs = logs
        self.workdir = workdir
        self.console = console
        self.console_prefix = console_prefix
        self.cancel = cancel or threading.Event()
        self.secrets = [s.encode() for s in secrets if s]
        self.log_header = log_header
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(plans))))
        self._events: queue.Queue[int] = queue.Queue()
        self._abort = threading.Event()
        self.progress_timeout = progress_timeout
        self.on_moved = on_moved
        self.progress = ProgressClock()
        self._hung = False

    # -- the lifecycle ------------------------------------------------------------------

    def run(self) -> GangOutcome:
        """Bring every host up, watch, tear down, inspect; never raises for host trouble."""
        started = time.time()
        launched_at = first_at = teardown_s = None
        first_failed: str | None = None
        stop_listening = (
            deadlines.subscribe(self.lease_of, self._renewed) if self.lease_of is not None else lambda: None
        )
        try:
            ok = self._each(self._bring_up) and not self.cancel.is_set()
            launched_at = time.time()
            if ok:
                first = self._watch_with_progress()
                if first is not None:
                    first_failed, first_at = first.plan.entry, time.time()
            failed = first_failed is not None or self.cancel.is_set() or not ok or self._hung
            for h in self.hosts:
                with h.lock:
                    h.torn_down = h.launch_sent and h.exit_code is None and not h.connection_lost
            t0 = time.time()
            # Everything launched is killed and checked, on success too: a step must leave
            # nothing behind.  Hosts that dropped before launching are only asked whether
            # they were preempted.
            self._each(
                lambda h: self._teardown(h, ask_metadata=failed) if h.launch_sent else self._inspect_lost(h)
            )
            teardown_s = time.time() - t0
            self._join_readers()
        finally:
            stop_listening()
            self._close_all()
            self._pool.shutdown(wait=True)
        return GangOutcome(
            hosts=tuple(h.outcome() for h in self.hosts),
            cancelled=self.cancel.is_set(),
            started_at=started,
            ended_at=time.time(),
            launched_at=launched_at,
            first_failed=first_failed,
            first_failure_at=first_at,
            teardown_s=teardown_s,
            synced_hosts=sum(h.synced for h in self.hosts),
            hung=self._hung,
            last_progress_at=self.progress.last if self._hung else None,
            progress_timeout=self.progress_timeout,
        )

    def _each(self, fn: Callable[[_HostState], bool | None]) -> bool:
        """Apply ``fn`` to every host through the bounded pool; False when any host failed."""
        results = list(self._pool.map(lambda h: self._guard(fn, h), self.hosts))
        return all(results)

    def _guard(self, fn: Callable[[_HostState], bool | None], h: _HostState) -> bool:
        try:
            return fn(h) is not False
        except HostUnreachable as e:
            h.reachable = False
            h.connection_lost = h.conn is not None
            h.note = str(e)
        except ConnectionLost as e:
            h.connection_lost = True
            h.note = str(e)
        except (HostKeyError, SshAuthError, HostUnknown) as e:
            # Retrying cannot fix a refused key; the backend stops at once.
            h.infra_error, h.fatal = str(e), True
        except SshError as e:
            h.infra_error = str(e)
        except (WorkdirSyncError, ValueError) as e:
            h.infra_error = f"{h.plan.entry}: {e}"
        return False

    # -- phases -------------------------------------------------------------------------

    def _bring_up(self, h: _HostState) -> bool:
        """Connect, sync and launch one host, without waiting for the others.

        Hosts start as soon as each is ready (a barrier after each phase would make the
        whole gang wait for its slowest handshake twice).  Once any host fails, hosts
        not yet started are left alone and those started are torn down by :meth:`run`.
        """
        try:
            if self._abort.is_set() or self.cancel.is_set():
                return False
            h.conn = SshConnection.connect(h.plan.target)
            h.connected = True
            self._prepare(h)
            if self._abort.is_set() or self.cancel.is_set():
                return False
            self._launch(h)
            return True
        except BaseException:
            self._abort.set()
            raise

    def _prepare(self, h: _HostState) -> None:
        """Make sure the host holds this workdir, uploading it if not."""
        if self.workdir is None:
            return
        assert h.conn is not None
        s = h.plan.settings
        script = (
            f"root={remote_path(s.remote_workdir)}; "
            'mkdir -p "$root" && cd "$root" && echo "ROOT $(pwd -P)" || exit 1; '
            + presence_check(".", self.workdir.digest)
        )
        result = h.conn.run(script)
        lines = dict(line.partition(" ")[::2] for line in result.stdout.splitlines())
        if result.exit_code != 0 or "ROOT" not in lines:
            raise WorkdirSyncError(
                f"cannot create remote_workdir {s.remote_workdir!r}: {result.stderr.strip()[-300:]}"
            )
        h.remote_root = lines["ROOT"]
        if "HAVE" not in lines:
            upload_and_unpack(h.conn, self.workdir, h.remote_root)
            h.synced = True

    def _launch_script(self, h: _HostState) -> str:
        q = shlex.quote
        s = h.plan.settings
        cwd = f"cd {q(f'{h.remote_root}/{self.workdir.digest}')} || exit 126; " if self.workdir else ""
        # Hygiene runs in the launch session itself: every extra session per host adds
        # to the launch latency of a large gang.
        hygiene = (
            f"timeout {_HYGIENE_TIMEOUT_S} /bin/sh -c {q(s.hygiene_command)} </dev/null >/dev/null 2>&1; "
        )
        # The wrapper becomes a new session (so its pgid is its pid) and records that
        # pgid for the teardown.  A watcher reads the channel's stdin, which marinbuild
        # never closes: end of input means marinbuild died or its connection broke, and
        # the whole group is stopped rather than left holding the TPU.  Each line on it
        # is the number of seconds the step's lease still covers (0: no lease); when no
        # new line comes within that time (marinbuild is suspended, or cut off from its
        # store and so from renewing), the group is SIGKILLed before the lease can be
        # taken over.  A host without GNU `timeout` only watches for end of input.  The
        # command's exit code is written down too, for a driver that reconnects after a
        # drop; `setsid -w` passes it back to this channel.
        watcher = (
            "t=$4; if timeout --foreground 0 true 2>/dev/null; then "
            "while l=$(timeout --foreground \"$t\" sh -c 'IFS= read -r l && echo \"$l\"'); s=$?; [ $s = 0 ]; "
            'do t=$l; done; else while read -r _; do :; done; s=1; fi; '
            "if [ $s = 124 ]; then kill -s KILL -- -$$; else kill -s TERM -- -$$; fi"
        )
        wrapper = (
            'echo $$ > "$1/pgid"; exec 3<&0; '
            f"( {watcher} ) <&3 >/dev/null 2>&1 & w=$!; "
            '"$2" -c "$3" </dev/null 3<&-; rc=$?; kill $w 2>/dev/null; '
            'echo $rc > "$1/rc"; exit $rc'
        )
        left = self._lease_left()
        return (
            f"att={h.attempt_dir}; mkdir -p \"$att\" || exit 125; {hygiene}{cwd}"
            f"{export_env(h.plan.env)}; export {PROGRESS_VAR}=\"$att/progress\"; "
            "if [ -x /bin/bash ]; then sh=/bin/bash; else sh=/bin/sh; fi; "
            f'exec setsid -w /bin/sh -c {q(wrapper)} marinbuild "$att" "$sh" {q(self.command)} {left} 2>&1'
        )

    def _lease_left(self) -> str:
        """Seconds the step's lease covers now, as the watcher reads them (``0``: no lease)."""
        deadline = deadlines.latest(self.lease_of) if self.lease_of is not None else None
        if deadline is None or deadline.monotonic == math.inf:
            return "0"
        return f"{max(0.001, deadline.remaining()):.3f}"

    def _renewed(self, deadline: Deadline) -> None:
        # From the heartbeat thread: tell every launched host how long the lease now covers.
        line = f"{max(0.001, deadline.remaining()):.3f}\n".encode()
        for h in self.hosts:
            chan = h.chan
            if chan is None or chan.closed:
                continue
            try:
                chan.sendall(line)
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the connection is gone: the host's watcher sees end of input

    def _launch(self, h: _HostState) -> None:
        assert h.conn is not None
        log = self.logs.open(h.plan.slice_index, h.plan.worker_index)
        if self.log_header:
            log.write(self.log_header.replace("{host}", h.plan.entry).encode())
            log.flush()
        try:
            h.launch_sent = True
            h.chan = h.conn.open_command(self._launch_script(h), hold_stdin=True)
        except BaseException:
            log.close()
            raise
        to_console = h is self.hosts[0]
        h.reader = threading.Thread(
            target=self._pump, args=(h, log, to_console), name=f"gang-{h.plan.entry}", daemon=True
        )
        h.reader.start()

    def _pump(self, h: _HostState, log: IO[bytes], to_console: bool) -> None:
        """Copy one host's output to its log (and the console) until the channel ends."""
        chan = h.chan
        assert chan is not None
        pending = b""
        # Wake up now and then even without output, to notice an exit status (below).
        chan.settimeout(1.0)
        try:
            while True:
                try:
                    data = chan.recv(32768)
                except TimeoutError:
                    # A process left in the background can hold the output open after
                    # the command exited; its exit status is what ends the host's part.
                    if chan.exit_status_ready():
                        break
                    continue
                except (OSError, EOFError, paramiko.SSHException):
                    data = b""
                if not data:
                    break
                self.progress.moved()
                pending += data
                lines = pending.split(b"\n")
                pending = lines.pop()
                if len(pending) > _MAX_LINE:
                    lines.append(pending)
                    pending = b""
                self._emit(lines, log, to_console)
            if pending:
                self._emit([pending], log, to_console)
        finally:
            log.close()
            chan.status_event.wait(2.0)
            code = chan.exit_status if chan.exit_status_ready() else -1
            transport = chan.get_transport()
            transport_ok = transport is not None and transport.is_active()
            with h.lock:
                if code == -1 and not transport_ok:
                    h.connection_lost = True
                else:
                    # -1 on a live connection: killed by a signal, which SSH reports
                    # without an exit status.
                    h.exit_code = code
            self._events.put(self.hosts.index(h))

    def _emit(self, lines: list[bytes], log: IO[bytes], to_console: bool) -> None:
        for line in lines:
            for s in self.secrets:
                line = line.replace(s, b"***")
            log.write(line + b"\n")
            if to_console:
                self.console(self.console_prefix + line.decode(errors="replace").rstrip("\r"))
        log.flush()

    def _watch_with_progress(self) -> _HostState | None:
        """:meth:`_watch`, with every host's progress file looked at meanwhile (when hangs are watched)."""
        if self.progress_timeout is None:
            return self._watch()
        self.progress.moved()  # the clock starts once every host runs
        stop = threading.Event()
        poller = threading.Thread(target=self._poll_progress, args=(stop,), name="gang-progress", daemon=True)
        poller.start()
        try:
            return self._watch()
        finally:
            stop.set()
            poller.join()

    def _poll_progress(self, stop: threading.Event) -> None:
        """Ask each host, every so often, whether its ``$MARINBUILD_PROGRESS`` file changed.

        Only a change counts, compared with the host's own earlier answer: the hosts'
        clocks are never compared with this machine's.
        """
        assert self.progress_timeout is not None
        seen: dict[int, str] = {}

        def ask(i: int, h: _HostState) -> None:
            conn = h.conn
            if conn is None or not conn.alive or h.exit_code is not None:
                return
            try:
                result = conn.run(f'stat -c "%y %s" {h.attempt_dir}/progress 2>/dev/null; true', timeout=10.0)
            except (SshError, OSError, EOFError, paramiko.SSHException):
                return
            answer = result.stdout.strip()
            if answer and seen.get(i, "") != answer:
                seen[i] = answer
                self.progress.moved()

        interval = poll_interval(self.progress_timeout)
        told = None
        while True:
            if self.on_moved is not None and self.progress.last != told:
                told = self.progress.last
                self.on_moved(told)  # at most once a look: a note, not a stream
            if stop.wait(interval):
                return
            list(self._pool.map(lambda pair: ask(*pair), list(enumerate(self.hosts))))

    def _watch(self) -> _HostState | None:
        """Wait until every host finished well (None), one failed (that host), or none made progress (None)."""
        running = len(self.hosts)
        while running:
            if self.cancel.is_set():
                return None
            if self.progress_timeout is not None and self.progress.quiet_for() >= self.progress_timeout:
                self._hung = True
                return None
            try:
                i = self._events.get(timeout=0.1)
            except queue.Empty:
                continue
            running -= 1
            h = self.hosts[i]
            if h.connection_lost or h.exit_code != 0:
                return h
        return None

    def _teardown_script(self, h: _HostState, ask_metadata: bool) -> str:
        q = shlex.quote
        ticks = max(1, int(h.plan.settings.kill_grace * 10))
        token = h.plan.env[TOKEN_VAR]
        script = f"""
att={h.attempt_dir}; tok={q(token)}
members() {{
  pg=; [ -f "$att/pgid" ] && read -r pg < "$att/pgid"
  if [ -n "$pg" ]; then
    for d in /proc/[0-9]*; do
      {{ read -r l < "$d/stat"; }} 2>/dev/null || continue
      r=${{l##*) }}; set -- $r
      [ "$3" = "$pg" ] && [ "$1" != Z ] && echo "${{d#/proc/}}"
    done
  fi
  for f in $(grep -lzx "{TOKEN_VAR}=$tok" /proc/[0-9]*/environ 2>/dev/null); do
    p=${{f#/proc/}}; p=${{p%%/*}}
    {{ read -r l < "/proc/$p/stat"; }} 2>/dev/null || continue
    r=${{l##*) }}; set -- $r; [ "$1" != Z ] && echo "$p"
  done
}}
left() {{ members | sort -u | tr '\\n' ' '; }}
ps=$(left)
if [ -n "$ps" ]; then
  [ -n "$pg" ] && kill -s TERM -- "-$pg" 2>/dev/null
  kill -TERM $ps 2>/dev/null
  i=0; while [ $i -lt {ticks} ]; do ps=$(left); [ -z "$ps" ] && break; sleep 0.1; i=$((i+1)); done
  if [ -n "$ps" ]; then
    [ -n "$pg" ] && kill -s KILL -- "-$pg" 2>/dev/null
    kill -KILL $ps 2>/dev/null
    i=0; while [ $i -lt 20 ]; do ps=$(left); [ -z "$ps" ] && break; sleep 0.1; i=$((i+1)); done
  fi
fi
echo "SURVIVORS $ps"
[ -f "$att/rc" ] && echo "RC $(cat "$att/rc")"
"""
        if ask_metadata:
            script += f'echo "META $({metadata_query_command()})"\n'
        script += '[ -z "$ps" ] && rm -rf "$att"\ntrue\n'
        return script

    def _teardown(self, h: _HostState, *, ask_metadata: bool) -> None:
        if not h.launch_sent:
            return
        budget = h.plan.settings.kill_grace + _TEARDOWN_SLACK_S
        result = self._on_host(h, self._teardown_script(h, ask_metadata), budget)
        if result is None:
            return
        for line in result.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "SURVIVORS":
                h.survivors = tuple(int(p) for p in value.split())
            elif key == "RC" and value.strip().lstrip("-").isdigit():
                # The code the wrapper wrote down, for a host whose channel died first.
                with h.lock:
                    if h.exit_code is None:
                        h.exit_code = int(value)
            elif key == "META":
                h.metadata_preempted = parse_metadata_answer(value)

    def _inspect_lost(self, h: _HostState) -> None:
        if h.connection_lost and h.reachable is None:
            result = self._on_host(h, metadata_query_command(), _TEARDOWN_SLACK_S)
            if result is not None:
                h.metadata_preempted = parse_metadata_answer(result.stdout)

    def _on_host(self, h: _HostState, script: str, timeout: float) -> CommandResult | None:
        """Run a control script on ``h`` over its connection, or a fresh one if that fails.

        A connection can look alive long after its VM vanished, so a control command
        that gets no answer is retried over a new connection; when that cannot be
        opened the host no longer answers SSH, which counts as preemption.  None then.
        """
        if h.conn is not None and h.conn.alive:
            try:
                return h.conn.run(script, timeout=timeout)
            except ConnectionLost:
                h.connection_lost = True
        try:
            fresh = SshConnection.connect(h.plan.target)
        except (HostUnreachable, ConnectionLost) as e:
            h.reachable, h.note = False, str(e)
            return None
        if h.conn is not None:
            h.conn.close()
        h.conn = fresh
        if h.connection_lost:
            h.reachable = True
        return fresh.run(script, timeout=timeout)

    def _join_readers(self) -> None:
        deadline = time.time() + _READER_JOIN_S
        for h in self.hosts:
            if h.reader is not None:
                h.reader.join(max(0.0, deadline - time.time()))
                if h.reader.is_alive() and h.chan is not None:
                    h.chan.close()
                    h.reader.join(1.0)

    def _close_all(self) -> None:
        for h in self.hosts:
            if h.conn is not None:
                h.conn.close()
