"""Starting `sapo-node` processes warm: forked from one server process that imported the node's libraries once.

A node process spends its first 10-15 CPU seconds importing torch, transformers, TRL, hivemind and datasets. A
program that starts several nodes on one machine (`sapo-node local-swarm`, a benchmark, the test suite) can pay that
once: a :class:`WarmStarter` runs a small server process (``python -m sapo.node.warm_start``) that imports
:data:`NODE_MODULES` and then forks one child per request; the child runs ``sapo-node ARGS`` exactly as ``python -m
sapo.node.cli ARGS`` would, with the output files, environment, working directory and session it was asked for, its
own PID and its own exit code (which the server reports back). A script that uses the library (``python SCRIPT
ARGS``: an example, a training script) starts warm the same way.

OpenMP and several libraries read their environment once, at import: the server serves only requests whose
environment is its own, but for :data:`VARYING` and the variables its starter declared read later; any other
request is refused and :func:`start_node_process` starts that command cold. A starter made with ``share=True`` names
its server's socket in ``SAPO_WARM_START`` for the processes this one starts (a node, a local swarm, a benchmark),
whose own starts then go to the same server (:meth:`WarmStarter.shared`): one server for the whole tree.
"""

from __future__ import annotations

import array
import atexit
import gc
import json
import os
import runpy
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import IO

__all__ = ["NODE_MODULES", "SHARED", "VARYING", "WarmProcess", "WarmStartRefused", "WarmStarter", "start_node_process"]

NODE_MODULES = (
    "sapo.node.options",
    "sapo.node.runner",
    "sapo.trainer",
    "sapo.models",
    "sapo.evaluation",
    "sapo.reasoning_gym",
    "sapo.node.local_swarm",
    "reasoning_gym",  # imported by a node's first task check (0.6-1.5 CPU s), not by the modules above
)
"""The modules the server imports before it forks: what a node imports before its first step."""

SHARED = "SAPO_WARM_START"
"""The environment variable naming a shared server's socket (set by ``WarmStarter(share=True)``)."""

VARYING = frozenset({"PYTEST_CURRENT_TEST", SHARED})
"""Variables a process may set otherwise than the server's environment and still start warm (read by no library at
import); a starter may declare more."""

_THREADS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")
_LENGTH = struct.Struct("!I")
_STATUS = struct.Struct("!q")  # the pid once forked (0: refused, a reason follows), then the exit code once reaped
_MAX_REQUEST = 1 << 22


class WarmStartRefused(RuntimeError):
    """The server did not start the process (another environment, or the server is gone): start it cold."""


def _send(sock: socket.socket, payload: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(payload).encode()
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([_LENGTH.pack(len(data)) + data], rights)


def _receive(sock: socket.socket, fds_expected: int) -> tuple[dict, list[int]] | None:
    """One message and the descriptors sent with it (they come with its first bytes); None if the stream ends
    first or the message is over :data:`_MAX_REQUEST` bytes."""
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_LEN(fds_expected * fds.itemsize))
    for level, kind, item in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(item[: len(item) - len(item) % fds.itemsize])
    size = _LENGTH.unpack(data[: _LENGTH.size])[0] if len(data) >= _LENGTH.size else _MAX_REQUEST + 1
    while len(data) < _LENGTH.size + size <= _LENGTH.size + _MAX_REQUEST:
        more = sock.recv(1 << 16)
        if not more:
            break
        data += more
    if size > _MAX_REQUEST or len(data) != _LENGTH.size + size:
        for fd in fds:
            os.close(fd)
        return None
    return json.loads(data[_LENGTH.size :]), list(fds)


class WarmProcess:
    """A `sapo-node` process started by a :class:`WarmStarter`: the part of :class:`subprocess.Popen` a program
    that starts nodes uses (``pid``, ``poll``, ``wait``, ``returncode``, ``send_signal``, ``terminate``, ``kill``,
    and ``stdout`` where it asked for a pipe). Its parent is the server, which reports its exit code."""

    def __init__(self, connection: socket.socket, args: list[str], stdout: IO | None) -> None:
        self._connection = connection
        self.args = args
        self.stdout = stdout
        self.stdin = self.stderr = None
        self.returncode: int | None = None
        data = connection.recv(_STATUS.size, socket.MSG_WAITALL)
        self.pid = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else 0
        if self.pid == 0:  # refused (a reason follows), or the server ended (nothing follows)
            reason = connection.recv(4096).decode(errors="replace")
            connection.close()
            raise WarmStartRefused(reason or "the server is gone")

    def poll(self) -> int | None:
        """The exit code if the process ended (minus the signal's number where a signal ended it), else None."""
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            data = self._connection.recv(_STATUS.size, socket.MSG_WAITALL)
            self.returncode = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else 255  # 255: server killed
            self._connection.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to end and return its exit code; raises `subprocess.TimeoutExpired` after
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            select.select([self._connection], [], [], left)
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

    ``env``: the server's environment (default: this process's when the starter is made), with the thread settings
    `sapo-node` sets itself before torch loads (:func:`sapo.speed.threads.share_the_machine`: ``OMP_NUM_THREADS`` and
    ``OMP_WAIT_POLICY``, each unless set). ``varying``: variables, besides :data:`VARYING`, that a request's
    environment may set otherwise, since nothing reads them at import (default none). ``share``: name the server's
    socket in this process's ``SAPO_WARM_START`` once it runs, so that the processes this one starts use the same
    server (default False). The server starts with the first :meth:`start` (its imports take the seconds one node's
    would) and ends at :meth:`close` or with this process; the processes it started keep running.
    """

    def __init__(
        self, env: Mapping[str, str] | None = None, varying: frozenset[str] = frozenset(), share: bool = False
    ) -> None:
        from sapo.speed.threads import PASSIVE_WAITING, usable_cores

        self.env = {name: value for name, value in (os.environ if env is None else env).items() if name != SHARED}
        self.env.setdefault("OMP_NUM_THREADS", str(usable_cores()))
        for name, value in PASSIVE_WAITING.items():
            self.env.setdefault(name, value)
        self.varying = VARYING | varying
        self.share = share
        self._address: str | None = None
        self._server: subprocess.Popen | None = None
        self._owner: socket.socket | None = None  # held open: the server ends when it closes
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """The server's socket (starting the server if it is not running yet): what ``SAPO_WARM_START`` names."""
        return self._ensure_server()

    def prepare(self) -> None:
        """Start the server now rather than at the first :meth:`start` (its imports then run while this process does
        other work); nothing for a shared server."""
        self._ensure_server()

    @classmethod
    def shared(cls) -> WarmStarter | None:
        """A starter for the server named in ``SAPO_WARM_START``, or None where none is named."""
        address = os.environ.get(SHARED)
        if not address:
            return None
        starter = cls(env={})  # a client only: the server, and its environment, are another process's
        starter._address = address
        return starter

    def start(
        self,
        args: Sequence[str],
        *,
        stdout: int | IO | None = None,
        stderr: int | IO | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        start_new_session: bool = False,
        script: str | os.PathLike | None = None,
        netns: str | None = None,
        module: str | None = None,
    ) -> WarmProcess:
        """Start ``sapo-node ARGS`` forked warm, or with ``script`` ``python SCRIPT ARGS`` (a program using the
        library, e.g. an example). ``stdout`` and ``stderr`` as for :class:`subprocess.Popen`: None (this
        process's), a file or descriptor, ``subprocess.DEVNULL``, ``subprocess.PIPE`` (stdout only) or
        ``subprocess.STDOUT`` (stderr only); ``env`` its environment (default this process's); ``cwd`` its working
        directory (default this process's); ``netns`` a named network namespace (``ip netns add``) to run it in, as
        ``ip netns exec`` would; ``module`` instead of ``sapo.node.cli``, ``python -m MODULE ARGS`` (a benchmark's
        runs, each in a process of its own). Raises :class:`WarmStartRefused` where the server cannot start it (another
        environment): start it cold then."""
        opened: list[int] = []
        pipe_read = None
        env = dict(os.environ if env is None else env)
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
                "script": None if script is None else os.path.abspath(os.fspath(script)),
                "netns": netns,
                "module": module,
            }
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(self._ensure_server())
                _send(connection, request, [out, err])
            except OSError as e:
                connection.close()
                raise WarmStartRefused(f"the warm starter's server is not reachable: {e}") from e
            if script:
                shown = [sys.executable, os.fspath(script)]
            else:
                shown = [sys.executable, "-m", module] if module else ["sapo-node"]
            process = WarmProcess(connection, [*shown, *args], os.fdopen(pipe_read, "rb") if pipe_read else None)
        except BaseException:
            if pipe_read is not None:
                os.close(pipe_read)
            raise
        finally:
            for fd in opened:
                os.close(fd)
        return process

    def close(self) -> None:
        """End the server this starter started (the processes it started keep running); nothing for a shared one."""
        with self._lock:
            if self._owner is not None:
                self._owner.close()
                self._owner = None
            if self._server is not None:
                try:
                    self._server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._server.kill()
                    self._server.wait()
                self._server = None
                if os.environ.get(SHARED) == self._address:
                    del os.environ[SHARED]
                shutil.rmtree(os.path.dirname(self._address or "/nonexistent"), ignore_errors=True)

    def _ensure_server(self) -> str:
        with self._lock:
            if self._server is not None and self._server.poll() is not None:
                raise OSError(f"the warm starter's server exited with {self._server.returncode}")
            if self._address is None:
                self._address = os.path.join(tempfile.mkdtemp(prefix="sapo-warm-"), "server.sock")
                ours, theirs = socket.socketpair()
                config = json.dumps({"address": self._address, "varying": sorted(self.varying)})
                self._server = subprocess.Popen(
                    [sys.executable, "-m", "sapo.node.warm_start", str(theirs.fileno()), config],
                    pass_fds=[theirs.fileno()],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                )
                theirs.close()
                self._owner = ours
                if ours.recv(1) != b"1":  # the server listens (its imports come after)
                    raise OSError("the warm starter's server did not start")
                atexit.register(self.close)
                if self.share:
                    os.environ[SHARED] = self._address
            return self._address

    @staticmethod
    def _fd(target: int | IO | None, opened: list[int], inherited: IO) -> int:
        if target is None or target in (subprocess.PIPE, subprocess.STDOUT):
            return inherited.fileno()  # PIPE and STDOUT are replaced by the caller
        if target == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            opened.append(fd)
            return fd
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
    netns: str | None = None,
) -> subprocess.Popen | WarmProcess:
    """Start ``command``: forked warm where it is ``[sys.executable, "-m", "sapo.node.cli", ...]`` or
    ``[sys.executable, "SCRIPT.py", ...]`` and the server of ``starter`` serves its environment (``env``, default this
    process's); otherwise, and without a starter (the default), cold, as :class:`subprocess.Popen` starts it. With
    ``netns``, in that named network namespace (cold: under ``ip netns exec``, which execs the command: the same
    PID)."""
    command = [os.fspath(part) for part in command]
    script = command[1] if len(command) > 1 and command[1].endswith(".py") else None
    if starter is not None and command[0] == sys.executable and (script or command[1:3] == ["-m", "sapo.node.cli"]):
        try:
            return starter.start(
                command[2:] if script else command[3:], stdout=stdout, stderr=stderr, env=env, cwd=cwd,
                start_new_session=start_new_session, script=script, netns=netns,
            )  # fmt: skip
        except WarmStartRefused:
            pass
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command]
    return subprocess.Popen(
        command, stdout=stdout, stderr=stderr, env=None if env is None else dict(env), cwd=cwd,
        start_new_session=start_new_session,
    )  # fmt: skip


# The server: `python -m sapo.node.warm_start OWNER_FD CONFIG`.


def _imported(env: Mapping[str, str], varying: frozenset[str]) -> dict[str, str]:
    """What of ``env`` the imports could have read: all but the variables read later."""
    return {name: value for name, value in env.items() if name not in varying}


def _serve(owner: socket.socket, listener: socket.socket, varying: frozenset[str]) -> None:
    """Fork a node for each request until the owner's connection ends; report each child's pid, then its exit code."""
    server_env = _imported(os.environ, varying)
    waiting: dict[int, socket.socket] = {}
    while True:
        ready = select.select([owner, listener], [], [], 0.1)[0]
        if owner in ready:
            break  # the starter is gone (or closed it): nobody owns the nodes' exit codes any more
        if listener in ready:
            connection, _ = listener.accept()
            connection.settimeout(30.0)  # a starter that connects and stalls holds the server no longer
            received = _receive(connection, fds_expected=2)
            if received is not None:
                request, fds = received
                env = {**{name: os.environ[name] for name in _THREADS}, **request["env"]}
                if len(fds) != 2 or _imported(env, varying) != server_env:
                    connection.sendall(_STATUS.pack(0) + b"this environment differs from the warm server's")
                    connection.close()
                else:
                    pid = os.fork()
                    if pid == 0:
                        for held in (owner, listener, connection, *waiting.values()):
                            held.close()
                        _become_requested(request, env, *fds)
                    connection.sendall(_STATUS.pack(pid))
                    waiting[pid] = connection
                for fd in fds:
                    os.close(fd)
            else:
                connection.close()
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid, None)
            if connection is not None:
                try:
                    connection.sendall(_STATUS.pack(os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass  # its starter no longer asks
                connection.close()


def _become_requested(request: dict, env: dict[str, str], out: int, err: int) -> None:
    """In the forked child: become ``python -m sapo.node.cli ARGS`` or ``python SCRIPT ARGS`` (streams, environment,
    directory, session, network namespace, arguments), run it, and end as the interpreter would (non-daemon threads
    joined, exit handlers run, streams flushed)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        os.close(fd)
    if request.get("netns"):
        try:
            _enter_netns(request["netns"])
        except OSError:
            traceback.print_exc()
            os._exit(1)  # never back into the server's loop
    if request["session"]:
        os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    script = request.get("script")
    sys.path[0] = os.path.dirname(script) if script else request["cwd"]  # as `python SCRIPT` or `python -m` puts it
    sys.argv = [script or "-m", *request["args"]]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # a fresh process draws its own global numpy state; forks would all share the server's
    code = 0
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(request.get("module") or "sapo.node.cli", run_name="__main__", alter_sys=True)
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


def _enter_netns(name: str) -> None:
    """Move this process (one thread, just forked) into the network namespace ``ip netns add NAME`` made: the
    threads and processes it starts (p2pd) are then there too."""
    import ctypes

    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)


def _exit_code(code: object) -> int:
    """The exit code the interpreter gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main() -> None:
    """The server's entry point: listen, import :data:`NODE_MODULES` (after the thread settings, as a node does) and
    freeze them out of garbage collections (``gc.freeze``), then serve until the owner's connection ends."""
    from sapo.collector import freeze_long_lived
    from sapo.speed.threads import share_the_machine

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the nodes and the program that started them
    share_the_machine()
    owner = socket.socket(fileno=int(sys.argv[1]))
    config = json.loads(sys.argv[2])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(config["address"])
    listener.listen(64)
    owner.sendall(b"1")
    # The imports make half a million objects that live as long as the server: collections meanwhile find next to
    # no garbage (a fifth of the imports' CPU). Frozen once imported, they are left out of the forked nodes'
    # collections too, which then neither scan them nor copy the pages they touch.
    gc.disable()
    for module in NODE_MODULES:
        __import__(module)
    freeze_long_lived()
    gc.enable()
    try:
        _serve(owner, listener, frozenset(config["varying"]))
    finally:
        listener.close()
        os.unlink(config["address"])


if __name__ == "__main__":
    main()
