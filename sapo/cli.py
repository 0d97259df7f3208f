"""Old entry point of `sapo-node` (`python -m sapo.cli`), kept for scripts that call it: see `sapo.node.cli`."""

from sapo.node.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
