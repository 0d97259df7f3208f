"""hivemind's private names live in swarm/hivemind_bridge.py alone, each listed with what it relies on; a guard finds
any elsewhere; a signing key written to a file loads back as the same key."""

from __future__ import annotations

import os
import re

from tests.private_names import ROOT, private_uses, project_files

HIVEMIND = ("hivemind",)
BRIDGE = "swarm/hivemind_bridge.py"


def test_no_module_outside_the_bridge_uses_a_private_name_of_hivemind():
    uses = private_uses(project_files(), HIVEMIND, {BRIDGE: None})
    assert uses == [], "private names of hivemind outside swarm/hivemind_bridge.py (move them behind it, with a line " \
        "saying what it relies on): " + "; ".join(map(str, uses))  # fmt: skip


def test_the_bridge_lists_every_private_name_it_uses():
    import swarm.hivemind_bridge

    used = {use.name for use in private_uses([ROOT / BRIDGE], HIVEMIND)}
    listed = set(re.findall(r"\b_[A-Za-z]\w*", swarm.hivemind_bridge.__doc__))
    assert used and used <= listed, f"{BRIDGE} uses {sorted(used - listed)} without listing them in its docstring"


def test_the_guard_finds_private_names_of_hivemind_it_was_not_told_about(tmp_path):
    new = tmp_path / "swarm" / "new_transport.py"
    new.parent.mkdir()
    new.write_text(
        "from hivemind.p2p import P2P\n"
        "from hivemind.utils.crypto import _RSA_PADDING\n"  # 2
        "\n"
        "\n"
        "def pid(p2p):\n"
        "    return p2p._child.pid\n"  # 6
        "\n"
        "\n"
        "def tasks(control):\n"
        "    return getattr(control, '_read_task', None)\n"  # 10
        "\n"
        "\n"
        "class Mine(P2P):\n"  # 13
        "    @staticmethod\n"
        "    def _make_process_args(*args, **kwargs):\n"
        "        return []\n"
        "\n"
        "    def alive(self):\n"
        "        return self._alive\n"  # 19
        "\n"
        "\n"
        "class Own:\n"  # the module's own class: its `_client` is its own
        "    def __init__(self, client):\n"
        "        self._client = client\n"
    )
    found = {(use.line, use.name, use.how) for use in private_uses([*project_files(), new], HIVEMIND, {BRIDGE: None})}
    assert found == {
        (2, "_RSA_PADDING", "import"),
        (6, "_child", "attribute"),
        (10, "_read_task", "string"),
        (13, "_make_process_args", "override in Mine"),
        (19, "_alive", "attribute"),
    }


def test_a_signing_key_written_to_its_file_loads_back_as_the_same_key(tmp_path):
    from swarm.identity import load_or_create_signing_key

    path = tmp_path / "keys" / "peer.pem"
    created = load_or_create_signing_key(str(path))
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----") and os.stat(path).st_mode & 0o777 == 0o600
    loaded = load_or_create_signing_key(str(path))
    assert loaded.get_public_key().to_bytes() == created.get_public_key().to_bytes()
    assert loaded.to_bytes() == created.to_bytes() and created.get_public_key().verify(
        b"record", loaded.sign(b"record")
    )
