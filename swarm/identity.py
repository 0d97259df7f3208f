"""A peer's record signing key: loaded from its PEM file, or created there (mode 0600) on first start; and the one key
shape the swarm accepts from others."""

from __future__ import annotations

import base64
import binascii
import functools
import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from swarm.records import RecordRejected

KEY_BITS = 2048
"""The modulus size of every signing key in the swarm (hivemind's :class:`RSAPrivateKey` makes these)."""

PUBLIC_EXPONENT = 65537
"""The public exponent of every signing key in the swarm."""

# The SSH wire form of such a key: "ssh-rsa", the exponent (mpint 0x010001) and the modulus (an mpint of KEY_BITS
# bits, its top bit set, hence a leading zero byte), each behind its uint32 length. Fixed: its length and prefix say
# the key's size and exponent before any arithmetic on it.
_BLOB_PREFIX = (
    b"\x00\x00\x00\x07ssh-rsa"
    + b"\x00\x00\x00\x03"
    + PUBLIC_EXPONENT.to_bytes(3, "big")
    + (KEY_BITS // 8 + 1).to_bytes(4, "big")
    + b"\x00"
)
_BLOB_BYTES = len(_BLOB_PREFIX) + KEY_BITS // 8
_SSH_RSA = b"ssh-rsa "


def check_key_blob(blob: bytes) -> None:
    """Refuse (:class:`~swarm.records.RecordRejected` ``bad_key``) anything but the SSH wire form of an RSA key of
    :data:`KEY_BITS` bits with exponent :data:`PUBLIC_EXPONENT`. Constant work, done before any signature check: a
    larger modulus or exponent would let a sender choose what verifying it costs."""
    if (
        not isinstance(blob, bytes)
        or len(blob) != _BLOB_BYTES
        or not blob.startswith(_BLOB_PREFIX)
        or blob[len(_BLOB_PREFIX)] < 0x80
    ):
        raise RecordRejected(
            "bad_key", f"a signing key must be RSA-{KEY_BITS} with exponent {PUBLIC_EXPONENT}: {blob!r:.60}"
        )


def check_public_key(public_key: bytes) -> None:
    """:func:`check_key_blob` of an OpenSSH public key (``b"ssh-rsa <base64>"``, the form an owner marker holds)."""
    if (
        not isinstance(public_key, bytes)
        or not public_key.startswith(_SSH_RSA)
        or len(public_key) != len(_SSH_RSA) + 4 * (_BLOB_BYTES // 3)  # 279 bytes: base64 without padding
    ):
        raise RecordRejected("bad_key", f"a signing key must be ssh-rsa of {KEY_BITS} bits: {public_key!r:.60}")
    try:
        blob = base64.b64decode(public_key[len(_SSH_RSA) :], validate=True)
    except binascii.Error:
        raise RecordRejected("bad_key", "a signing key that is not base64") from None
    check_key_blob(blob)


@functools.lru_cache(maxsize=4096)
def public_key_of(public_key: bytes) -> RSAPublicKey:
    """The key to verify with of an OpenSSH public key that passed :func:`check_public_key` (parsed once per key)."""
    return RSAPublicKey.from_bytes(public_key)


def load_or_create_signing_key(path: str | None) -> RSAPrivateKey:
    """The RSA signing key stored at ``path`` (PEM, mode 0600), created if missing; fresh if ``path`` is None.

    A stable key gives a stable identity: other peers see this peer as a fingerprint of its public key.

    Raises:
        ValueError: the file holds another kind of key than RSA-2048 with exponent 65537 (other peers refuse those).
    """
    if path is None:
        return RSAPrivateKey()
    key = RSAPrivateKey.__new__(RSAPrivateKey)  # the class only knows how to generate; wrap a loaded key
    if os.path.exists(path):
        with open(path, "rb") as f:
            loaded = serialization.load_pem_private_key(f.read(), password=None)
        if (
            not isinstance(loaded, rsa.RSAPrivateKey)
            or loaded.key_size != KEY_BITS
            or loaded.public_key().public_numbers().e != PUBLIC_EXPONENT
        ):
            raise ValueError(
                f"signing key {path} is not an RSA-{KEY_BITS} key with exponent {PUBLIC_EXPONENT}, the only kind "
                "other peers accept: move it away and start again (a new key is created there)"
            )
        key._private_key = loaded
        return key
    fresh = RSAPrivateKey()
    pem = fresh._private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # O_EXCL: two processes starting with the same new path cannot both write (and silently differ).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return fresh
