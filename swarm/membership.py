"""Closed swarms: a list of member peer ids signed by the swarm's operator, and the DHT check that keeps outsiders out.

An operator who wants a swarm of known peers collects their ids (``python -m swarm.membership id --key PEM``: the
fingerprint of a peer's record signing key, as :attr:`swarm.transport.SwarmTransport.peer_id` shows it), signs the
list with a key of their own (``python -m swarm.membership sign ...``) and hands every member the file and the
operator key's id. A peer started with them (``DHTTransportConfig.membership_path`` and ``membership_operator``)
accepts announcements, index entries and records (in its DHT storage and from the publishers it fetches) only of
members, counting the rest as ``rejected/not_member``; a peer that is not in the list refuses to start. Without a
membership file a swarm is open.

The file is JSON: ``{"swarm", "members", "issued_at", "operator_key", "signature"}``; the signature (RSA-PSS, base64)
covers the canonical JSON of the first three. It keeps outsiders from publishing into the swarm; it does not hide
the swarm's records from an outsider who reaches a member (records are signed, not encrypted).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from swarm.validation import fingerprint, subkey_owner

_PEER_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class Membership:
    """A verified membership list.

    Parameters:
        swarm (`str`): the swarm it is for (``DHTTransportConfig.swarm_name``).
        members (`frozenset[str]`): the member peer ids.
        operator (`str`): the id of the key that signed it.
        issued_at (`float`): when it was signed.
    """

    swarm: str
    members: frozenset[str]
    operator: str
    issued_at: float

    def admits(self, peer: str) -> bool:
        """True if ``peer`` is a member."""
        return peer in self.members


def _signed_part(swarm: str, members: Sequence[str], issued_at: float) -> bytes:
    return json.dumps({"swarm": swarm, "members": sorted(members), "issued_at": issued_at}, sort_keys=True).encode()


def sign_membership(
    operator_key: RSAPrivateKey, swarm: str, members: Iterable[str], issued_at: float | None = None
) -> str:
    """The JSON text of a membership file listing ``members`` of ``swarm``, signed with ``operator_key``.

    Raises:
        ValueError: a member id is not a peer id (16 lowercase hex characters).
    """
    members = sorted(set(members))
    for member in members:
        if not _PEER_ID.fullmatch(member):
            raise ValueError(f"{member!r} is not a peer id (16 hex characters, as a peer's peer_id shows it)")
    issued_at = time.time() if issued_at is None else issued_at
    signature = operator_key.sign(_signed_part(swarm, members, issued_at))
    document = {
        "swarm": swarm,
        "members": members,
        "issued_at": issued_at,
        "operator_key": operator_key.get_public_key().to_bytes().decode(),
        "signature": signature.decode(),
    }
    return json.dumps(document, indent=1)


def parse_membership(text: str, operator: str, swarm: str, source: str = "membership file") -> Membership:
    """Verify a membership file's text: signed by the key whose id is ``operator``, for ``swarm``.

    Raises:
        ValueError: naming what is wrong (not JSON, fields, operator, signature, swarm) and how to fix it.
    """
    try:
        document = json.loads(text)
        members = [str(m) for m in document["members"]]
        operator_key = document["operator_key"].encode()
        signature = document["signature"].encode()
        issued_at = float(document["issued_at"])
        named_swarm = str(document["swarm"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{source} is not a membership file ({type(e).__name__}: {e}); make one with "
            "`python -m swarm.membership sign`"
        ) from None
    if fingerprint(operator_key) != operator:
        raise ValueError(
            f"{source} is signed by key {fingerprint(operator_key)}, not by the operator {operator} "
            "(membership_operator): use the file your operator signed, or correct membership_operator"
        )
    try:
        valid = RSAPublicKey.from_bytes(operator_key).verify(_signed_part(named_swarm, members, issued_at), signature)
    except Exception:
        valid = False
    if not valid:
        raise ValueError(f"{source}: the signature does not match its content (edited after signing?); sign it again")
    if named_swarm != swarm:
        raise ValueError(f"{source} is for swarm {named_swarm!r}, not {swarm!r} (swarm_name)")
    return Membership(swarm=named_swarm, members=frozenset(members), operator=operator, issued_at=issued_at)


def load_membership(path: str, operator: str | None, swarm: str) -> Membership:
    """Read and verify the membership file at ``path`` (see :func:`parse_membership`).

    Raises:
        ValueError: no ``operator`` given, an unreadable file, or a file that does not verify.
    """
    if not operator:
        raise ValueError(
            f"membership_path={path!r} needs membership_operator: the id of the key that signed the file "
            "(`python -m swarm.membership id --key OPERATOR.pem` prints it)"
        )
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read the membership file {path!r}: {e}") from None
    return parse_membership(text, operator, swarm, source=f"membership file {path!r}")


class MembershipValidator(RecordValidatorBase):
    """A DHT validator that refuses records whose owner is not a member: outsiders store nothing on members.

    Args:
        admits: whether a peer id is a member (:meth:`Membership.admits`).
        on_reject: called with ``(reason, detail)`` for each refused record.
    """

    def __init__(self, admits: Callable[[str], bool], on_reject: Callable[[str, str], None]):
        self._admits = admits
        self._on_reject = on_reject

    @property
    def priority(self) -> int:
        return 5  # after the owner signature check (10), which proves whose the subkey is

    def validate(self, record: DHTRecord) -> bool:
        """True if the record's owner (its subkey's key) is a member."""
        try:
            public_key = subkey_owner(record.subkey)
        except Exception:  # refused by the owner signature check already, which counts it
            public_key = None
        if public_key is None or not self._admits(fingerprint(public_key)):
            self._on_reject("not_member", "record of a peer outside the swarm's membership")
            return False
        return True


def _key(path: str) -> RSAPrivateKey:
    from swarm.identity import load_or_create_signing_key

    return load_or_create_signing_key(path)


def main(argv: Sequence[str] | None = None) -> Any:
    """``python -m swarm.membership id|sign|show``: a key's peer id, sign a membership file, check one."""
    parser = argparse.ArgumentParser(prog="python -m swarm.membership", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ident = commands.add_parser("id", help="print the peer id of a signing key (PEM; created if missing)")
    ident.add_argument("--key", required=True)
    sign = commands.add_parser("sign", help="sign a membership file")
    sign.add_argument("--key", required=True, help="the operator's signing key (PEM; created if missing)")
    sign.add_argument("--swarm", default="sapo", help="the swarm's name (swarm_name)")
    sign.add_argument("--members", nargs="+", required=True, help="member peer ids, or files of one id a line")
    sign.add_argument("--out", required=True)
    show = commands.add_parser("show", help="verify a membership file and list its members")
    show.add_argument("path")
    show.add_argument("--operator", required=True)
    show.add_argument("--swarm", default="sapo")
    args = parser.parse_args(argv)
    if args.command == "id":
        peer = fingerprint(_key(args.key).get_public_key().to_bytes())
        print(peer)
        return peer
    if args.command == "sign":
        members = []
        for item in args.members:
            if _PEER_ID.fullmatch(item):
                members.append(item)
            else:
                with open(item) as f:
                    members += [line.strip() for line in f if line.strip() and not line.startswith("#")]
        key = _key(args.key)
        with open(args.out, "w") as f:
            f.write(sign_membership(key, args.swarm, members))
        print(f"{args.out}: {len(set(members))} member(s) of swarm {args.swarm!r}, operator "
              f"{fingerprint(key.get_public_key().to_bytes())}")  # fmt: skip
        return args.out
    membership = load_membership(args.path, args.operator, args.swarm)
    print("\n".join(sorted(membership.members)))
    return membership


if __name__ == "__main__":
    main()
