"""Starting `sapo-node` processes warm: forked from one server process that imported the node's libraries once.

A node process spends its first 10-15 CPU seconds importing torch, transformers, TRL, hivemind and datasets. A
program that starts several nodes on one machine (`sapo-node local-swarm`, a benchmark, the test suite) can pay that
once: a :class:`WarmStarter` runs a small server process (``python -m sapo.node.warm_start``) that imports
:data:`NODE_MODULES` and then forks one child per request; the child runs ``sapo-node ARGS`` exactly as ``python -m
sapo.node.cli ARGS`` would, with the output files, working directory and session it was asked for, its own PID and
its own exit code (which the server reports back). OpenMP reads its settings once, when torch is loaded: every
process a starter starts runs in the starter's environment, fixed when its server starts; :func:`start_node_process`
starts any other command, or one meant for another environment, cold.
"""

from __future__ import annotations

import array
import atexit
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import IO

__all__ = ["NODE_MODULES", "VARYING", "WarmProcess", "WarmStarter", "start_node_process"]

NODE_MODULES = (
    "sapo.node.options",
    "sapo.node.runner",
    "sapo.trainer",
    "sapo.models",
    "sapo.evaluation",
    "sapo.reasoning_gym",
    "sapo.node.local_swarm",
)
"""The modules the server imports before it forks: what a node imports before its first step."""

VARYING = frozenset({"PYTEST_CURRENT_TEST"})
"""Variables a process may set otherwise than the starter's environment and still start warm (read by no library
at import); a starter may be told of more."""

_STATUS = struct.Struct("!qq")  # (pid, exit code): the pid when forked, then the exit code once reaped
_MAX_REQUEST = 1 << 20


def _send(sock: socket.socket, payload: dict, fds: Sequence[int]) -> None:
    data = json.dumps(payload).encode()
    sock.sendmsg([struct.pack("!I", len(data)) + data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """One request and the descriptors sent with it; None at the end of the stream."""
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(_MAX_REQUEST + 4, socket.CMSG_LEN(8 * fds.itemsize))
    for level, kind, item in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(item[: len(item) - len(item) % fds.itemsize])
    if not data:
        return None
    (size,) = struct.unpack("!I", data[:4])
    while len(data) < size + 4:  # a long environment may arrive in parts (the descriptors come with the first)
        more = sock.recv(size + 4 - len(data))
        if not more:
            return None
        data += more
    return json.loads(data[4:]), list(fds)


class WarmProcess:
    """A `sapo-node` process started by a :class:`WarmStarter`: the part of :class:`subprocess.Popen` a program
    that starts nodes uses (``pid``, ``poll``, ``wait``, ``returncode``, ``send_signal``, ``terminate``, ``kill``,
    and ``stdout`` where it asked for a pipe). Its parent is the starter's server, which reports its exit code."""

    def __init__(self, status: socket.socket, args: list[str], stdout: IO | None) -> None:
        self._status = status
        self.args = args
        self.stdout = stdout
        self.stdin = self.stderr = None
        self.returncode: int | None = None
        (self.pid, _) = self._read(block=True) or (0, 0)
        if not self.pid:
            raise RuntimeError("the warm starter's server ended before it started the process")

    def _read(self, block: bool) -> tuple[int, int] | None:
        if not block and not select.select([self._status], [], [], 0)[0]:
            return None
        data = self._status.recv(_STATUS.size, socket.MSG_WAITALL)
        return _STATUS.unpack(data) if len(data) == _STATUS.size else None

    def poll(self) -> int | None:
        """The exit code if the process ended (minus the signal's number where a signal ended it), else None."""
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            ended = self._read(block=True)
            self.returncode = ended[1] if ended else 255  # 255: the server itself was killed
            self._status.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end and return its exit code; raises `subprocess.TimeoutExpired` after
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            select.select([self._status], [], [], left)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the process, unless it already ended."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        """Send SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL."""
        self.send_signal(signal.SIGKILL)


class WarmStarter:
    """Starts `sapo-node` processes forked from a server that imported :data:`NODE_MODULES` once.

    ``env`` is the environment of every process it starts (default: this process's when the starter is made), with
    the thread settings `sapo-node` sets itself before torch loads (:func:`sapo.speed.threads.share_the_machine`:
    ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY``, each unless set). ``varying``: variables, besides :data:`VARYING`,
    that a process may set otherwise and still start warm, since nothing reads them at import (default none). The
    server starts with the first :meth:`start` (its imports take the seconds one node's would) and ends at
    :meth:`close` or with this process; processes it started keep running.
    """

    def __init__(self, env: Mapping[str, str] | None = None, varying: frozenset[str] = frozenset()) -> None:
        from sapo.speed.threads import PASSIVE_WAITING, usable_cores

        self.varying = VARYING | varying
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("OMP_NUM_THREADS", str(usable_cores()))
        for name, value in PASSIVE_WAITING.items():
            self.env.setdefault(name, value)
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._lock = threading.Lock()

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a process meant to run in ``env`` can start warm: the libraries were imported in this starter's
        environment, so ``env`` must be that one (but for :data:`VARYING`, and the thread settings a node sets
        itself where ``env`` lacks them)."""
        return self._imported(self._completed(env)) == self._imported(self.env)

    def _completed(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the thread settings a node would set itself where it lacks them."""
        return {**{name: self.env[name] for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}, **env}

    def _imported(self, env: Mapping[str, str]) -> dict[str, str]:
        return {name: value for name, value in env.items() if name not in self.varying}

    def start(
        self,
        args: Sequence[str],
        *,
        stdout: int | IO | None = None,
        stderr: int | IO | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        start_new_session: bool = False,
    ) -> WarmProcess:
        """Start ``sapo-node ARGS`` forked warm. ``stdout`` and ``stderr`` as for :class:`subprocess.Popen`: None
        (this process's), a file or descriptor, ``subprocess.DEVNULL``, ``subprocess.PIPE`` (stdout only) or
        ``subprocess.STDOUT`` (stderr only); ``env`` its environment (default the starter's; one it
        :meth:`serves`, else ValueError); ``cwd`` its working directory (default this process's)."""
        env = self.env if env is None else self._completed(env)
        if self._imported(env) != self._imported(self.env):
            raise ValueError("this environment differs from the warm starter's: start the process cold")
        opened: list[int] = []
        pipe_read = None
        status, theirs = socket.socketpair()
        try:
            out = self._fd(stdout, opened, sys.stdout)
            if stdout == subprocess.PIPE:
                pipe_read, out = os.pipe()
                opened.append(out)
            err = out if stderr == subprocess.STDOUT else self._fd(stderr, opened, sys.stderr)
            request = {
                "args": list(args),
                "cwd": os.fspath(cwd or os.getcwd()),
                "env": env,
                "session": start_new_session,
            }
            with self._lock:
                control = self._ensure_server()
                _send(control, request, [theirs.fileno(), out, err])
            process = WarmProcess(status, ["sapo-node", *args], os.fdopen(pipe_read, "rb") if pipe_read else None)
        except BaseException:
            status.close()
            if pipe_read is not None:
                os.close(pipe_read)
            raise
        finally:
            theirs.close()
            for fd in opened:
                os.close(fd)
        return process

    def close(self) -> None:
        """End the server (the processes it started keep running)."""
        with self._lock:
            if self._control is not None:
                self._control.close()
                self._control = None
            if self._server is not None:
                try:
                    self._server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._server.kill()
                    self._server.wait()
                self._server = None

    def _ensure_server(self) -> socket.socket:
        if self._control is None or self._server is None or self._server.poll() is not None:
            ours, theirs = socket.socketpair()
            self._server = subprocess.Popen(
                [sys.executable, "-m", "sapo.node.warm_start", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=self.env,
                stdin=subprocess.DEVNULL,
            )
            theirs.close()
            self._control = ours
            atexit.register(self.close)
        return self._control

    @staticmethod
    def _fd(target: int | IO | None, opened: list[int], inherited: IO) -> int:
        if target is None:
            return inherited.fileno()
        if target == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            opened.append(fd)
            return fd
        if target in (subprocess.PIPE, subprocess.STDOUT):
            return inherited.fileno()  # replaced by the caller
        return target if isinstance(target, int) else target.fileno()


def start_node_process(
    command: Sequence[str | os.PathLike],
    *,
    starter: WarmStarter | None = None,
    stdout: int | IO | None = None,
    stderr: int | IO | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    start_new_session: bool = False,
) -> subprocess.Popen | WarmProcess:
    """Start ``command``: forked warm by ``starter`` where ``command`` is ``[sys.executable, "-m", "sapo.node.cli",
    ...]`` and its environment (``env``, default this process's) is one the starter serves; otherwise cold, as
    :class:`subprocess.Popen` starts it."""
    command = [os.fspath(part) for part in command]
    if (
        starter is not None
        and command[:3] == [sys.executable, "-m", "sapo.node.cli"]
        and starter.serves(os.environ if env is None else env)
    ):
        return starter.start(
            command[3:],
            stdout=stdout,
            stderr=stderr,
            env=os.environ if env is None else env,
            cwd=cwd,
            start_new_session=start_new_session,
        )
    return subprocess.Popen(
        command,
        stdout=stdout,
        stderr=stderr,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=start_new_session,
    )


# The server: `python -m sapo.node.warm_start FD`.


def _serve(control: socket.socket) -> None:
    """Fork a node for each request until the control socket ends; report each child's pid, then its exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the nodes and the program that started them
    waiting: dict[int, socket.socket] = {}
    open_ = True
    while open_ or waiting:
        if open_ and select.select([control], [], [], 0.1)[0]:
            received = _receive(control)
            if received is None:
                open_ = False  # the starter is gone: nobody is left to tell an exit code
                waiting.clear()
                continue
            request, (status_fd, out, err) = received
            status = socket.socket(fileno=status_fd)
            pid = os.fork()
            if pid == 0:
                control.close()
                status.close()
                _become_node(request, out, err)
            os.close(out)
            os.close(err)
            status.sendall(_STATUS.pack(pid, 0))
            waiting[pid] = status
        elif not open_:
            break
        while waiting:
            pid, code = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            status = waiting.pop(pid, None)
            if status is not None:
                try:
                    status.sendall(_STATUS.pack(pid, os.waitstatus_to_exitcode(code)))
                except OSError:
                    pass  # the starter no longer asks
                status.close()


def _become_node(request: dict, out: int, err: int) -> None:
    """In the forked child: become ``python -m sapo.node.cli ARGS`` (streams, directory, session, arguments), run
    it, and end as the interpreter would (non-daemon threads joined, exit handlers run, streams flushed)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    if err != out:
        os.close(err)
    if request["session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # as `python -m` puts it
    sys.argv = ["-m", *request["args"]]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # a fresh process draws its own global numpy state; forks would all share the server's
    code = 0
    try:
        runpy.run_module("sapo.node.cli", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _exit_code(code: object) -> int:
    """The exit code the interpreter gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main() -> None:
    """The server's entry point: import :data:`NODE_MODULES` (after the thread settings, as a node does), serve."""
    from sapo.speed.threads import share_the_machine

    share_the_machine()
    control = socket.socket(fileno=int(sys.argv[1]))
    for module in NODE_MODULES:
        __import__(module)
    _serve(control)


if __name__ == "__main__":
    main()
