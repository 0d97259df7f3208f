"""The `sapo-node` command: run a node, start a local swarm of nodes, check the machine, evaluate a model, or report on
a run."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `sapo-node`; returns the exit code.

    Called without ``argv`` (as the `sapo-node` program, or `python -m sapo.node.cli`), a node run owns the process:
    SIGTERM during its start-up exits 0 at once, and once the node is done (checkpoint written, swarm left, logs
    closed) the process ends within seconds (:func:`sapo.node.teardown.exit_process`) instead of returning.
    """
    import warnings

    # transformers 5 warns about its own renamed arguments on every config: noise for a node operator.
    warnings.filterwarnings("ignore", category=FutureWarning)
    program = argv is None
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
    if argv and argv[0] == "health":
        from sapo.node.health import main as health_main

        return health_main(argv[1:])
    if argv and argv[0] == "report":
        from sapo.node.report import main as report_main

        return report_main(argv[1:])

    if "--version" in argv:
        from sapo.node.about import sapo_version
        from swarm.records import WIRE_VERSION

        print(f"sapo-node (sapo-swarm) {sapo_version()}, wire version {WIRE_VERSION}")
        return 0
    if "--help-all" in argv:
        from sapo.node.errors import NodeError, refuse
        from sapo.node.options import full_help

        try:
            print(full_help(argv), end="")
        except NodeError as e:  # a bad --sampler: one line, as when the node starts
            return refuse(e, None)
        return 0

    if program:
        from sapo.node.teardown import stop_before_start

        stop_before_start()  # the imports below take seconds; the node's own handlers come after them
    from sapo.speed.threads import share_the_machine

    share_the_machine()  # before anything loads torch: OpenMP reads its thread count and wait policy once
    from sapo.node.options import config_yaml, output_dir_of, parse_node_options
    from sapo.node.runner import NodeError, refuse, run_node

    try:
        options = parse_node_options(argv)
    except NodeError as e:  # one line; in node.log and status.json too where the output directory exists
        return refuse(e, None if "--print-config" in argv else output_dir_of(argv), create=False)
    except SystemExit as e:  # argparse already said what is wrong (or printed --help)
        return int(e.code or 0)
    if options.print_config:
        print(config_yaml(options), end="")
        return 0
    code = run_node(options.args, options.node)
    if program:
        from sapo.node.teardown import exit_process

        exit_process(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
