"""`sapo-node doctor [node options]`: checks this machine before a node joins, one line per check with its fix.

It reads the same options as the node (flags, `--config`, `--set`), so it checks the model, directories and
addresses the node would use. Exit code 0 when the node can run (warnings included), 1 when a check failed.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OK, INFO, WARN, FAIL = "ok", "info", "warn", "FAIL"

GIB = 1024**3
RUNTIME_BYTES = 1.2 * GIB  # Python, torch, transformers, TRL, hivemind and the question source, before the model
PROMPT_TOKENS = 256  # a reasoning-gym question inside the chat template, for the logits estimate
DEFAULT_MODEL_PARAMETERS = 134_515_008  # SmolLM2-135M-Instruct
DEFAULT_MODEL_VOCAB = 49_152
MAX_CLOCK_OFFSET = 3.0  # seconds: hivemind's MAX_DHT_TIME_DISCREPANCY_SECONDS, and the swarm's clock_skew_tolerance


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, what was found, and how to fix it when it is not ok."""

    name: str
    status: str
    found: str
    fix: str = ""

    def line(self) -> str:
        """The check as one printed line."""
        fix = f" -> fix: {self.fix}" if self.fix and self.status in (WARN, FAIL) else ""
        return f"{self.status:>4}  {self.name:<14} {self.found}{fix}"


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ----------------------------------------------------------------------------------------------------
# the checks


def check_python() -> Check:
    """The interpreter the node runs on (the package itself requires Python 3.10 or later)."""
    version = ".".join(map(str, sys.version_info[:3]))
    return Check("python", OK, f"{version} ({sys.executable})")


def check_torch() -> list[Check]:
    """torch's build (CPU or CUDA), its threads against the cores this process may use, and a GPU if any."""
    try:
        import torch
    except ImportError as e:
        return [Check("torch", FAIL, str(e), "run setup.sh (it installs the CPU build of torch first)")]
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = torch.get_num_threads()
    checks = [Check("torch", OK, f"{torch.__version__}, {build} build")]
    if threads > cores:
        checks.append(
            Check(
                "threads",
                WARN,
                f"{threads} math threads on {cores} usable core(s)",
                f"set OMP_NUM_THREADS={cores}: oversubscribed threads slow every step",
            )
        )
    else:
        checks.append(Check("threads", OK, f"{threads} math threads, {cores} usable core(s)"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            name = torch.cuda.get_device_name(i)
            checks.append(Check("gpu", OK, f"cuda:{i} {name}, {_gib(free)} free of {_gib(total)}"))
    elif torch.version.cuda:
        checks.append(
            Check(
                "gpu",
                WARN,
                "a CUDA build of torch, but no GPU is visible",
                "check the driver (nvidia-smi); in Docker, run with --gpus all",
            )
        )
    else:
        checks.append(Check("gpu", INFO, "none: the node trains on the CPU"))
    return checks


@dataclass(frozen=True)
class ModelSize:
    """What the memory and disk checks need to know of the policy."""

    parameters: int
    vocab: int
    converted: bool  # False: the default model is converted (GGUF -> safetensors) on the node's first start


def check_model(node: Any) -> tuple[Check, ModelSize | None]:
    """The policy the node loads: the embedded default (its wheel, its converted cache) or a local directory."""
    from sapo import models

    if node.model == "default":
        # A complete converted copy is all a node loads: the wheel is needed only to make it (the Docker image
        # converts at build time and uninstalls the wheel).
        if (converted := models.cached_default_model_path()) is not None:
            size = ModelSize(DEFAULT_MODEL_PARAMETERS, DEFAULT_MODEL_VOCAB, True)
            return Check("model", OK, f"default {models.DEFAULT_MODEL_NAME}, converted copy in {converted}"), size
        try:
            gguf = models.default_gguf_path()
        except ModuleNotFoundError as e:
            return Check(
                "model", FAIL, "the default model's wheel is missing", str(e).split("install it with: ")[-1]
            ), None
        cached = models.cache_dir() / "models" / models.DEFAULT_MODEL_NAME
        return Check(
            "model",
            OK,
            f"default {models.DEFAULT_MODEL_NAME} ({gguf.name}); the first start converts it "
            f"into {cached} (about 30 s)",
        ), ModelSize(DEFAULT_MODEL_PARAMETERS, DEFAULT_MODEL_VOCAB, False)
    try:
        config = models._check_model_dir(Path(node.model))
    except (FileNotFoundError, ValueError, OSError) as e:
        return Check("model", FAIL, str(e), "pass --model a local Hugging Face causal-LM directory, or `default`"), None
    return Check("model", OK, f"{node.model} ({config.model_type})"), ModelSize(
        _count_parameters(config), int(getattr(config, "vocab_size", DEFAULT_MODEL_VOCAB)), True
    )


def _count_parameters(config: Any) -> int:
    """Parameters of a model built from ``config`` on the meta device (no memory, no weights read)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def memory_needed(size: ModelSize, node: Any, args: Any) -> float:
    """Bytes a node is estimated to need: the runtime, float32 weights, gradients and Adam moments of what it trains
    (all weights, or about 1 % with LoRA), and the logits of one training batch (three copies: values, log-softmax,
    gradients)."""
    trained = size.parameters if node.lora_r == 0 else size.parameters // 100
    tokens = args.per_device_train_batch_size * (PROMPT_TOKENS + args.max_completion_length)
    return RUNTIME_BYTES + 4 * size.parameters + 12 * trained + 3 * 4 * tokens * size.vocab


def available_memory() -> tuple[float, str]:
    """Bytes of memory this process can still use, and where the figure comes from (a cgroup limit counts)."""
    import psutil

    available, source = float(psutil.virtual_memory().available), "the machine's available memory"
    try:  # cgroup v2 (a container's --memory): the limit minus what the group uses
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = float(Path("/sys/fs/cgroup/memory.current").read_text())
            if float(limit) - used < available:
                available, source = float(limit) - used, "the container's memory limit"
    except (OSError, ValueError):
        pass
    return available, source


def check_memory(size: ModelSize | None, node: Any, args: Any) -> Check:
    """Available memory against the estimated need of the node."""
    available, source = available_memory()
    if size is None:
        return Check("memory", INFO, f"{_gib(available)} available ({source}); need unknown (model not found)")
    needed = memory_needed(size, node, args)
    found = f"{_gib(available)} available ({source}), a node of this model needs about {_gib(needed)}"
    fix = "close other programs, train LoRA adapters (--lora_r 16), or lower --per_device_train_batch_size"
    if available < needed:
        return Check("memory", FAIL, found, fix)
    if available < 1.5 * needed:
        return Check("memory", WARN, found + " (little headroom)", fix)
    return Check("memory", OK, found)


def _existing_parent(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(name: str, path: Path, needed: float, what: str) -> Check:
    """Free space (and write permission) where ``path`` is, or would be created."""
    where = _existing_parent(path)
    if not os.access(where, os.W_OK):
        return Check(name, FAIL, f"{where} is not writable", f"choose a writable directory for {what}")
    free = shutil.disk_usage(where).free
    found = f"{_gib(free)} free at {where}; {what}: about {_gib(needed)} needed"
    if free < needed:
        return Check(name, FAIL, found, f"free some space, or put {what} on another disk")
    if free < 2 * needed:
        return Check(name, WARN, found, f"free some space, or put {what} on another disk")
    return Check(name, OK, found)


def checkpoint_bytes(size: ModelSize, node: Any) -> float:
    """One checkpoint: the trained weights and their Adam moments in float32."""
    trained = size.parameters if node.lora_r == 0 else size.parameters // 100
    return 12.0 * trained


def check_p2pd() -> Check:
    """hivemind's p2pd daemon binary: present, executable, runs on this machine."""
    import importlib.resources

    try:
        path = Path(str(importlib.resources.files("hivemind.hivemind_cli") / "p2pd"))
    except ModuleNotFoundError as e:
        return Check("p2pd", FAIL, str(e), "run setup.sh (hivemind==1.1.12 ships p2pd)")
    fix = "reinstall hivemind: pip install --force-reinstall --no-deps hivemind==1.1.12"
    if not path.is_file():
        return Check("p2pd", FAIL, f"{path} is missing", fix)
    if not os.access(path, os.X_OK):
        return Check("p2pd", FAIL, f"{path} is not executable", f"chmod +x {path}")
    try:
        result = subprocess.run([str(path), "-help"], capture_output=True, text=True, timeout=20)
    except OSError as e:  # e.g. a binary of another architecture
        return Check("p2pd", FAIL, f"{path} does not run here: {e}", fix)
    if "Usage" not in result.stdout + result.stderr:
        return Check("p2pd", FAIL, f"{path} -help printed no usage (exit {result.returncode})", fix)
    return Check("p2pd", OK, str(path))


def _ip_port(maddr: Any) -> tuple[str | None, int | None]:
    from swarm.config import multiaddr_host

    return multiaddr_host(maddr), int(maddr["tcp"]) if "tcp" in {p.name for p in maddr.protocols()} else None


def port_in_use(host: str, port: int) -> OSError | None:
    """The error binding ``host:port`` raises now (e.g. address in use), or None when it is free.

    Bound with SO_REUSEADDR, as p2pd and the page server bind: a port held only by closed connections (TIME_WAIT,
    e.g. just after a restart) counts as free, one a process listens on does not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def check_addresses(node: Any) -> list[Check]:
    """The listen addresses (well formed, port free), announced addresses (well formed, public when others must
    reach them) and the status page's port."""
    from swarm.config import is_loopback_host, validate_multiaddr

    checks: list[Check] = []
    listens_everywhere = False
    for addr in node.host_maddrs:
        try:
            maddr = validate_multiaddr(addr, require_peer_id=False)
        except ValueError as e:
            checks.append(Check("listen", FAIL, str(e), "pass --host_maddrs /ip4/0.0.0.0/tcp/31337"))
            continue
        host, port = _ip_port(maddr)
        listens_everywhere |= host in ("0.0.0.0", "::")
        error = port_in_use(host, port) if host and port else None
        if error is not None:
            checks.append(
                Check(
                    "listen",
                    FAIL,
                    f"{addr}: {error.strerror or error}",
                    "another process (another sapo-node?) holds this port: stop it, or pass "
                    "--host_maddrs with another port",
                )
            )
        else:
            scope = "this machine only" if is_loopback_host(host) else "other machines"
            checks.append(Check("listen", OK, f"{addr} is free (accepts peers of {scope})"))
    announced = []
    for addr in node.announce_maddrs or []:
        try:
            announced.append(_ip_port(validate_multiaddr(addr, require_peer_id=False))[0])
            checks.append(Check("announce", OK, f"{addr} is well formed"))
        except ValueError as e:
            checks.append(Check("announce", FAIL, str(e), "pass --announce_maddrs /ip4/PUBLIC_IP/tcp/PORT"))
    if listens_everywhere and not node.announce_maddrs:
        checks.append(
            Check(
                "announce",
                INFO,
                "no --announce_maddrs: peers learn this node's addresses from libp2p "
                "(behind NAT, pass --announce_maddrs /ip4/PUBLIC_IP/tcp/PORT and forward the port)",
            )
        )
    for host in announced:
        try:
            private = ipaddress.ip_address(host).is_private
        except (TypeError, ValueError):
            continue  # a DNS name
        if private:
            checks.append(
                Check(
                    "announce",
                    WARN,
                    f"{host} is a private address: only peers on that network reach it",
                    "announce this machine's public address for peers on the internet",
                )
            )
    if node.status_port is not None and node.status_port != 0:
        error = port_in_use(node.status_host, node.status_port)
        if error is not None:
            checks.append(
                Check(
                    "status page",
                    WARN,
                    f"{node.status_host}:{node.status_port}: {error.strerror or error}",
                    "the node serves its page on a free port instead (logged); or pass --status_port",
                )
            )
        else:
            checks.append(Check("status page", OK, f"http://{node.status_host}:{node.status_port}/ is free"))
    return checks


def check_initial_peers(node: Any, timeout: float = 3.0) -> list[Check]:
    """Each initial peer: well formed, and whether its TCP port answers now; then, through the first that answers,
    the clock offset to it and the wire version it announces (:func:`check_peer`)."""
    from swarm.config import validate_multiaddr

    if not node.initial_peers:
        return [Check("initial peers", INFO, "none: the node starts a new swarm; others join it through its address")]
    checks, answering = [], []
    for addr in node.initial_peers:
        try:
            host, port = _ip_port(validate_multiaddr(addr, require_peer_id=True))
        except ValueError as e:
            checks.append(Check("initial peer", FAIL, str(e), "copy the address the first node printed"))
            continue
        try:
            with socket.create_connection((host, port), timeout=timeout):
                checks.append(Check("initial peer", OK, f"{addr} answers on TCP"))
                answering.append(addr)
        except OSError as e:
            checks.append(
                Check(
                    "initial peer",
                    WARN,
                    f"{addr} does not answer now ({e})",
                    "check the address and the peer's firewall; meanwhile the node trains alone and "
                    "keeps dialing it (--require_swarm exits instead)",
                )
            )
    if not answering:
        reason = "no initial peer answers"
        return [*checks, Check("clock", INFO, f"offset not measured: {reason}"), Check("wire", INFO, reason)]
    return checks + check_peer(answering[0], node.swarm_name)


def check_peer(address: str, swarm_name: str) -> list[Check]:
    """The clock offset to the peer at ``address`` (hivemind peers whose clocks differ by more than 3 s refuse each
    other) and the wire version it announces in the index of ``swarm_name`` (records of another version are
    refused), asked by a short-lived peer of this machine (:mod:`sapo.node.peer_probe`)."""
    from sapo.node.peer_probe import probe_peer
    from swarm.config import DHTTransportConfig
    from swarm.records import WIRE_VERSION

    probe = probe_peer(address, swarm_name, DHTTransportConfig().index_shards, timeout=10.0)
    if probe.error is not None:
        found = f"cannot ask {address}: {probe.error}"
        return [Check("clock", WARN, f"offset not measured: {found}", "check the address and that the peer runs"),
                Check("wire", INFO, "not checked: the peer could not be asked")]  # fmt: skip
    return [_clock_check(probe), _wire_check(probe, WIRE_VERSION)]


def _clock_check(probe: Any) -> Check:
    offset, uncertainty = probe.clock_offset, probe.round_trip / 2
    found = f"{offset:+.2f} s (± {uncertainty:.2f} s) to {probe.address.rsplit('/p2p/', 1)[-1]}"
    fix = "synchronize the clocks (NTP: timedatectl set-ntp true) on this machine and the peer's"
    if abs(offset) - uncertainty > MAX_CLOCK_OFFSET:
        return Check("clock", FAIL, f"{found}: hivemind peers more than {MAX_CLOCK_OFFSET:.0f} s apart refuse each "
                     "other", fix)  # fmt: skip
    if abs(offset) + uncertainty > MAX_CLOCK_OFFSET / 3:
        return Check("clock", WARN, f"{found}: close to hivemind's {MAX_CLOCK_OFFSET:.0f} s limit", fix)
    return Check("clock", OK, found)


def _wire_check(probe: Any, ours: int) -> Check:
    listed = ", ".join(f"{count} at version {version}" for version, count in probe.listed_versions.items())
    if not probe.peer_versions:
        where = f"the index lists {listed}" if listed else "the index lists no peer yet"
        return Check("wire", INFO, f"the peer announces no index entry of its own ({where}); this node speaks {ours}")
    if probe.peer_versions != [ours]:
        return Check(
            "wire",
            FAIL,
            f"the peer announces wire version {', '.join(map(str, probe.peer_versions))}, this node speaks {ours}: "
            "each refuses the other's records",
            "run the same sapo-swarm version as the swarm (sapo-node --version)",
        )
    return Check("wire", OK, f"the peer announces wire version {ours}, as this node speaks (index: {listed})")


def check_clock_sync() -> Check:
    """Whether this machine's clock is synchronized by NTP, where `timedatectl` can tell."""
    note = "hivemind peers need clocks within 3 s"
    if shutil.which("timedatectl") is None:
        return Check("clock sync", INFO, f"sync state unknown here; {note}")
    try:
        result = subprocess.run(
            ["timedatectl", "show", "-p", "NTPSynchronized", "--value"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return Check("clock sync", INFO, f"sync state unknown here; {note}")
    if result.returncode != 0:
        return Check("clock sync", INFO, f"sync state unknown here (timedatectl: no systemd); {note}")
    if result.stdout.strip() == "yes":
        return Check("clock sync", OK, "synchronized by NTP")
    return Check("clock sync", WARN, f"not synchronized by NTP; {note}", "turn NTP on: timedatectl set-ntp true")


# ----------------------------------------------------------------------------------------------------
# the command


def run_checks(args: Any, node: Any) -> list[Check]:
    """Every check for a node with these options, in the order printed."""
    from sapo.models import cache_dir

    checks = [check_python(), *check_torch()]
    model_check, size = check_model(node)
    checks += [model_check, check_memory(size, node, args)]
    if size is not None:
        keep = (args.save_total_limit or 3) + 2  # the kept checkpoints, one being written, the final model
        checks.append(
            check_disk(
                "output dir",
                Path(args.output_dir),
                keep * checkpoint_bytes(size, node) + 0.1 * GIB,
                "checkpoints and logs",
            )
        )
        if node.model == "default" and not size.converted:
            checks.append(check_disk("model cache", cache_dir(), 4.0 * size.parameters, "the converted default model"))
    checks.append(check_p2pd())
    checks += check_addresses(node)
    checks += check_initial_peers(node)
    checks.append(check_clock_sync())
    return checks


def main(argv: list[str]) -> int:
    """`sapo-node doctor`: print one line per check; 1 when the node cannot run, else 0."""
    from sapo.node.options import parse_node_args
    from sapo.node.runner import NodeError

    if argv and argv[0] in ("-h", "--help"):
        print(
            "usage: sapo-node doctor [node options ...]\n\nChecks this machine for a node with these options "
            "(the same flags, --config and --set as sapo-node): Python, torch, GPU, memory, disk, p2pd, the model, "
            "the ports and addresses, the initial peers, and through the first that answers the clock offset to it "
            "and the wire version it announces. Exit code 1 when a check fails."
        )
        return 0
    try:
        args, node, _ = parse_node_args(argv)
    except NodeError as e:
        print(f"sapo-node doctor: error: {e}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0)
    checks = run_checks(args, node)
    for check in checks:
        print(check.line(), flush=True)
    failed = [c for c in checks if c.status == FAIL]
    warned = [c for c in checks if c.status == WARN]
    if failed:
        print(f"\n{len(failed)} check(s) failed: this node cannot run until they are fixed.")
        return 1
    print(f"\nThis machine can run the node{f' ({len(warned)} warning(s))' if warned else ''}.")
    return 0
