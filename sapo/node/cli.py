"""The `sapo-node` command: run a node, start a local swarm of nodes, check the machine, evaluate a model, or report on
a run."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `sapo-node`; returns the exit code."""
    import warnings

    # transformers 5 warns about its own renamed arguments on every config: noise for a node operator.
    warnings.filterwarnings("ignore", category=FutureWarning)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "local-swarm":
        from sapo.node.local_swarm import main as local_swarm_main

        return local_swarm_main(argv[1:])
    if argv and argv[0] == "eval":
        from sapo.node.eval_command import main as eval_main

        return eval_main(argv[1:])
    if argv and argv[0] == "doctor":
        from sapo.node.doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv and argv[0] == "report":
        from sapo.node.report import main as report_main

        return report_main(argv[1:])

    from sapo.speed.threads import share_the_machine

    share_the_machine()  # before anything loads torch: OpenMP reads its thread count and wait policy once
    from sapo.node.options import config_yaml, parse_node_args
    from sapo.node.runner import NodeError, run_node

    try:
        args, node, print_config = parse_node_args(argv)
    except NodeError as e:
        print(f"sapo-node: error: {e}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # argparse already said what is wrong (or printed --help)
        return int(e.code or 0)
    if print_config:
        print(config_yaml(args, node), end="")
        return 0
    return run_node(args, node)


if __name__ == "__main__":
    sys.exit(main())
