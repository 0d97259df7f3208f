"""Raw run files kept compressed: one ``.tar.xz`` per experiment or benchmark under ``results/archive/``, read back.

``benchmarks/results/`` keeps what a reader opens (pages, summaries, plots) and each run's completion marker and
configurations; the files of a run that only scripts read (node logs, metrics, group logs, per-question outcomes) and
older runs' records go into ``results/archive/NAME.tar.xz``. Beside each archive ``NAME.files`` lists its members, one
``sha256 size path`` line each, paths relative to ``benchmarks/results``: a member is found without opening an
archive, and ``check`` proves each archive holds exactly what its listing says.

The report scripts read archived files through :func:`restored` (a run folder with its archived files put back, in
a temporary copy); a script that reads a folder itself (``sapo_table``'s page) needs ``unpack`` first::

    python -m benchmarks.results_archive list                    # archives, members, sizes
    python -m benchmarks.results_archive unpack sapo_table_runs  # put the members back in the tree (or --to DIR)
    python -m benchmarks.results_archive pack NAME PATH...       # move files (or folders' files) into NAME
    python -m benchmarks.results_archive check                   # every archive against its listing

``pack`` writes the archive beside the old one, reads every member back against the files it replaces, and only
then deletes them; a member already archived with other bytes is refused. Archives are deterministic (sorted
members, no times or owners), so packing the same files twice writes the same bytes.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import io
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

from benchmarks.harness import RESULTS

ARCHIVE = RESULTS / "archive"
RAW_RUN_FILES = ("metrics.jsonl", "groups.jsonl*", "node.log*", "held_out.jsonl")
"""A run's files that are archived: its node logs, metrics, group logs and per-question outcomes (a run's held-out
outcomes compress about 40-fold in an archive: kept plain, those of the campaign alone would fill 5.5 MB of the tree);
its completion marker, configurations, node records and sender records stay in place."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _relative(path: Path, results: Path) -> str:
    return path.resolve().relative_to(results.resolve()).as_posix()


def listing(archive: Path) -> dict[str, tuple[str, int]]:
    """An archive's members from its ``.files`` listing: path -> (sha256, size)."""
    members = {}
    for line in archive.with_suffix("").with_suffix(".files").read_text().splitlines():
        digest, size, path = line.split(" ", 2)
        members[path] = (digest, int(size))
    return members


def archives(results: Path = RESULTS) -> list[Path]:
    """Every archive under ``results/archive``, by name."""
    return sorted((results / "archive").glob("*.tar.xz"))


def read_members(archive: Path) -> dict[str, bytes]:
    """Every member of an archive: path -> bytes."""
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def write_archive(archive: Path, members: dict[str, bytes]) -> None:
    """Write ``members`` to ``archive`` deterministically and its listing beside it, then check both."""
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=6) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(members[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(members[name]))
    if read_members(partial) != members:
        partial.unlink()
        raise RuntimeError(f"{archive}: the written archive does not read back as its members")
    partial.replace(archive)
    lines = [f"{_digest(data)} {len(data)} {name}\n" for name, data in sorted(members.items())]
    archive.with_suffix("").with_suffix(".files").write_text("".join(lines))


def pack(name: str, paths: Iterable[Path], results: Path = RESULTS) -> list[Path]:
    """Move the files ``paths`` (a folder: its files) into ``results/archive/NAME.tar.xz``, adding to what the archive
    holds; returns the files deleted, each after its archived copy read back equal."""
    files = sorted({f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()})
    archive = results / "archive" / f"{name}.tar.xz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    members = read_members(archive) if archive.exists() else {}
    for file in files:
        key, data = _relative(file, results), file.read_bytes()
        if members.get(key, data) != data:
            raise ValueError(f"{key} is archived in {archive.name} with other bytes; refusing to replace it")
        members[key] = data
    if not files:
        return []
    write_archive(archive, members)
    kept = read_members(archive)
    for file in files:
        if kept[_relative(file, results)] != file.read_bytes():  # never reached after write_archive's check
            raise RuntimeError(f"{file} differs from its archived copy; nothing deleted")
    for file in files:
        file.unlink()
    for cached in (_index, _extracted, restored):
        cached.cache_clear()
    return files


def check(results: Path = RESULTS) -> list[str]:
    """Problems: an archive whose members differ from its listing, or a member also in the tree with other bytes."""
    problems = []
    for archive in archives(results):
        expected, members = listing(archive), read_members(archive)
        found = {name: (_digest(data), len(data)) for name, data in members.items()}
        if found != expected:
            problems.append(f"{archive.name}: members differ from {archive.with_suffix('').with_suffix('.files').name}")
        for name, data in members.items():
            on_disk = results / name
            if on_disk.is_file() and on_disk.read_bytes() != data:
                problems.append(f"{name}: in the tree and in {archive.name} with other bytes")
    return problems


def unpack(names: Sequence[str], dest: Path | None = None, results: Path = RESULTS) -> list[Path]:
    """Write the members of the named archives (all: ``names`` empty) under ``dest`` (default: back in the tree);
    a file already there is left as it is when equal and refused when not."""
    dest = results if dest is None else dest
    chosen = [a for a in archives(results) if not names or a.name.removesuffix(".tar.xz") in names]
    members = {name: data for archive in chosen for name, data in read_members(archive).items()}
    for name, data in members.items():  # every conflict before any write
        if (dest / name).exists() and (dest / name).read_bytes() != data:
            raise FileExistsError(f"{dest / name} exists with other bytes than its archived copy")
    written = []
    for name, data in sorted(members.items()):
        target = dest / name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(target)
    return written


@cache
def _index(results: Path) -> dict[str, Path]:
    """Member path -> its archive, from the listings."""
    return {member: archive for archive in archives(results) for member in listing(archive)}


@cache
def _scratch() -> Path:
    path = Path(tempfile.mkdtemp(prefix="sapo-results-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@cache
def _extracted(archive: Path) -> dict[str, bytes]:
    return read_members(archive)


@cache
def restored(directory: Path, results: Path = RESULTS) -> Path:
    """``directory`` itself when no archive holds a file under it; else a temporary copy of it (removed at exit)
    with its archived files put back, which reads as the folder did before it was packed."""
    try:
        prefix = _relative(directory, results) + "/"
    except ValueError:
        return directory  # outside the results tree: a run directory of the user's
    held = [(member, archive) for member, archive in _index(results.resolve()).items() if member.startswith(prefix)]
    if not held:
        return directory
    scratch = _scratch() / _digest(str(results.resolve()).encode())[:12]  # one per results tree
    copy = scratch / prefix
    if directory.is_dir():
        shutil.copytree(directory, copy, dirs_exist_ok=True)
    for member, archive in held:
        target = scratch / member
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_extracted(archive)[member])
    return copy


def resolved(path: Path) -> Path:
    """A file's path, or that of its restored copy where it is archived."""
    return path if path.exists() else restored(path.parent) / path.name


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.results_archive", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="archives with their members' count and size")
    unpacking = commands.add_parser("unpack", help="put archived files back (in the tree, or under --to)")
    unpacking.add_argument("names", nargs="*", help="archive names (default: all)")
    unpacking.add_argument("--to", type=Path, default=None)
    packing = commands.add_parser("pack", help="move files or folders' files into an archive")
    packing.add_argument("name")
    packing.add_argument("paths", nargs="+", type=Path)
    commands.add_parser("check", help="every archive against its listing; exit 1 on a problem")
    args = parser.parse_args(argv)
    if args.command == "list":
        for archive in archives():
            members = listing(archive)
            raw = sum(size for _, size in members.values())
            print(f"{archive.name}: {len(members)} files, {raw / 1e6:.1f} MB in {archive.stat().st_size / 1e6:.2f} MB")
    elif args.command == "unpack":
        print(f"{len(unpack(args.names, args.to))} file(s) written")
    elif args.command == "pack":
        print(f"{len(pack(args.name, args.paths))} file(s) archived in {args.name}.tar.xz and removed")
    else:
        problems = check()
        print("\n".join(problems) or f"{len(archives())} archive(s) match their listings")
        raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
