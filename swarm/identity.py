"""A peer's record signing key: loaded from its PEM file, or created there (mode 0600) on first start."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import serialization
from hivemind.utils.crypto import RSAPrivateKey

from swarm.hivemind_bridge import signing_key


def load_or_create_signing_key(path: str | None) -> RSAPrivateKey:
    """The RSA signing key stored at ``path`` (PEM, mode 0600), created if missing; fresh if ``path`` is None.

    A stable key gives a stable identity: other peers see this peer as a fingerprint of its public key.
    """
    if path is None:
        return RSAPrivateKey()
    if os.path.exists(path):
        with open(path, "rb") as f:
            return signing_key(serialization.load_pem_private_key(f.read(), password=None))
    fresh = RSAPrivateKey()
    pem = serialization.load_der_private_key(fresh.to_bytes(), password=None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # O_EXCL: two processes starting with the same new path cannot both write (and silently differ).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return fresh
