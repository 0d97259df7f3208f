"""Tooling shared by the tests and the benchmarks: hostile peers and payload attackers (attacks on a node),
network namespaces with a userspace WAN switch (hosts and links to cut), DHT peers on 127.0.0.1 that are always
stopped, and a tiny trainer run (its config, or the trainer).

Not part of the installed packages (a node never needs it); import it from the repository's root.
"""
