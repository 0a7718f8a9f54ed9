"""Ctrl-C and SIGTERM noted while held and handed on afterwards, with real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from marinbuild.backends.held_signals import HeldSignals


@pytest.fixture
def seen() -> list[int]:
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: got.append(number))
    yield got
    signal.signal(signal.SIGTERM, previous)


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    for _ in range(3):
        pass  # a Python-level handler runs between bytecodes, at the latest here


def test_a_signal_while_held_is_handed_on_at_release(seen: list[int]) -> None:
    held = HeldSignals()
    with held.installed():
        with held.holding():
            _signal_self(signal.SIGTERM)
            assert seen == [] and held.received == [signal.SIGTERM]
        assert seen == [signal.SIGTERM] and held.received == []
        _signal_self(signal.SIGTERM)  # not held: handed on at once
        assert seen == [signal.SIGTERM, signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is not held._on_signal  # put back


def test_a_held_keyboard_interrupt_is_raised_where_the_hold_ends() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    held = HeldSignals()
    steps: list[str] = []
    try:
        with held.installed(), pytest.raises(KeyboardInterrupt):
            with held.holding():
                _signal_self(signal.SIGINT)
                steps.append("the bookkeeping finished")
            steps.append("never")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert steps == ["the bookkeeping finished"]


def test_a_second_signal_goes_through_when_asked(seen: list[int]) -> None:
    held = HeldSignals(second_goes_through=True)
    with held.installed(), held.holding():
        _signal_self(signal.SIGTERM)
        assert seen == []
        _signal_self(signal.SIGTERM)  # the user means it: handled now, while held
        assert seen == [signal.SIGTERM]
    assert seen == [signal.SIGTERM, signal.SIGTERM]


def test_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        held = HeldSignals()
        with held.installed(), held.holding():
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
            _signal_self(signal.SIGTERM)
        assert held.received == []
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_held_signal_whose_action_is_the_default_ends_the_process_at_release() -> None:
    code = (
        "import os, signal\n"
        "from marinbuild.backends.held_signals import HeldSignals\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
        "held = HeldSignals()\n"
        "held.install()\n"
        "held.hold()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "held.uninstall()\n"
        "print('survived the hold', flush=True)\n"
        "held.release()\n"
        "print('survived the release', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.splitlines() == ["survived the hold"]


def test_a_signal_held_until_it_is_ignored_is_dropped(seen: list[int]) -> None:
    # A hold a storm left suspended is released by the collector after the command set the
    # signal to be ignored: what it noted is not raised into the collector then.
    held = HeldSignals()
    held.install()
    held.hold()
    _signal_self(signal.SIGTERM)
    held.uninstall()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        held.release()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [] and held.received == []


def test_a_signal_noted_while_holding_calls_on_noted_to_end_a_wait(seen: list[int]) -> None:
    import queue

    events: queue.SimpleQueue[str] = queue.SimpleQueue()
    held = HeldSignals(on_noted=lambda: events.put("wake"))
    with held.installed():
        with held.holding():
            _signal_self(signal.SIGTERM)
            assert events.get(timeout=5) == "wake" and seen == []  # the wait ended, the signal still held
        assert seen == [signal.SIGTERM]


_ANOTHER_THREAD_TAKES_IT = """
import queue, signal, threading
from marinbuild.backends.held_signals import HeldSignals
signal.signal(signal.SIGTERM, lambda number, frame: print("handled", flush=True))
events = queue.SimpleQueue()
held = HeldSignals(on_noted=lambda: events.put("wake"))
asleep = threading.Event()
def other():
    asleep.wait()
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # the kernel gives it to this thread
with held.installed():
    thread = threading.Thread(target=other)
    thread.start()
    with held.holding():
        asleep.set()
        try:
            print("woke by", events.get(timeout=30), flush=True)
        except queue.Empty:
            print("slept on", flush=True)
    thread.join()
    print("after the hold", flush=True)
"""


def test_a_signal_another_thread_takes_still_ends_the_main_threads_wait() -> None:
    # A real signal sent to a thread of its own: the main thread, asleep in a queue's wait,
    # is not interrupted by it, and Python runs the handler only on the main thread.
    done = subprocess.run([sys.executable, "-c", _ANOTHER_THREAD_TAKES_IT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["woke by wake", "handled", "after the hold"], done.stdout + done.stderr


_A_CHILD_OUTLIVES_THE_HOLD = """
import os, signal, threading, time
from marinbuild.backends.held_signals import HeldSignals, reset_in_child
signal.signal(signal.SIGTERM, lambda number, frame: None)
held = HeldSignals(on_noted=lambda: None)
held.install()
pid = os.fork()
if pid == 0:
    reset_in_child()  # as a forked function step does
    time.sleep(60)
    os._exit(0)
held.uninstall()
(relay,) = [t for t in threading.enumerate() if t.name == "signal-relay"] or [None]
if relay is not None:
    relay.join(20)
print("relay ended" if relay is None or not relay.is_alive() else "relay still reading", flush=True)
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
"""


def test_a_forked_child_living_on_does_not_keep_the_relay_reading() -> None:
    done = subprocess.run([sys.executable, "-c", _A_CHILD_OUTLIVES_THE_HOLD], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines() == ["relay ended"], done.stdout + done.stderr


_CTRL_C_AS_THE_RELAY_STARTS = """
import os, signal, threading
from marinbuild.backends import held_signals
signal.signal(signal.SIGINT, signal.default_int_handler)
real_start = threading.Thread.start
def start(self):
    real_start(self)
    if self.name == "signal-relay":  # a real Ctrl-C, the instant the reader is running
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(3):
            pass
threading.Thread.start = start
held = held_signals.HeldSignals(second_goes_through=True, on_noted=lambda: None)
try:
    with held.installed():
        print("installed", flush=True)
        with held.holding():
            pass
        print("never", flush=True)
except KeyboardInterrupt:
    print("interrupted at the hold's end", flush=True)
for thread in threading.enumerate():
    if thread.name == "signal-relay":
        thread.join(20)  # the reader closes its end once it sees the end of file
print("pipe left open" if held_signals._relay_fds else "pipe closed", flush=True)
"""


def test_a_ctrl_c_as_the_relay_starts_is_handed_on_at_the_first_hold_not_inside_the_start() -> None:
    # Raised inside the thread's start, the install closed the pipe the running reader then
    # closed again: a storm's Ctrl-C closed a file the import system had just opened (EBADF).
    done = subprocess.run([sys.executable, "-c", _CTRL_C_AS_THE_RELAY_STARTS], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines() == ["installed", "interrupted at the hold's end", "pipe closed"], (
        done.stdout + done.stderr)


def test_the_wakeup_fd_is_given_up_and_one_set_before_is_left_alone() -> None:
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        held = HeldSignals(on_noted=lambda: None)
        with held.installed():
            assert signal.set_wakeup_fd(-1) != -1  # taken for the hold
        assert signal.set_wakeup_fd(-1) == -1  # given up after
        signal.set_wakeup_fd(write)
        with held.installed():
            assert signal.set_wakeup_fd(write) == write  # someone else's: left as it was
        assert signal.set_wakeup_fd(-1) == write
    finally:
        signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)


def test_a_forked_child_gets_the_default_handlers_back_and_a_program_its_stop_handler() -> None:
    import os
    import signal

    from marinbuild.backends.held_signals import handle_stops, reset_in_child

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child process
        try:
            signal.signal(signal.SIGTERM, lambda *_: None)
            reset_in_child()
            seen = [signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
            stops: list[int] = []
            handle_stops(lambda signum, frame: stops.append(signum))
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            os.write(write, repr((seen, stops)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        answer = got.read()
    os.waitpid(pid, 0)
    assert answer == repr(([True, True, True], [int(signal.SIGTERM), int(signal.SIGINT)]))
