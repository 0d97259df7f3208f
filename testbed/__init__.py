"""Tooling shared by the tests and the benchmarks: hostile peers and payload attackers (attacks on a node),
network namespaces with a userspace WAN switch (hosts and links to cut), and the config of a tiny trainer run.

Not part of the installed packages (a node never needs it); import it from the repository's root.
"""
