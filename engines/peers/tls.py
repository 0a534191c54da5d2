"""This box's identity for paired boxes: a self-signed TLS certificate made once (an EC P-256
key, the private key 0600 beside it), its SHA-256 fingerprint, and the ssl contexts of the
mutual-TLS link between paired boxes. Each side trusts exactly the certificates it pinned at
pairing; nothing here trusts a certificate authority.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
LOCK_FILE = "identity.lock"  # held while an identity is made
VALID_DAYS = 100 * 365  # a pinned identity: its lifetime is the pairing's, not a CA's policy


@dataclass(frozen=True)
class Identity:
    """This box's certificate (PEM), where its files are, and its fingerprint."""

    cert_pem: str
    cert_file: Path
    key_file: Path
    fingerprint: str


def fingerprint_der(der: bytes) -> str:
    """SHA-256 of a certificate's DER bytes, lower-case hex (what is pinned and compared)."""
    return hashlib.sha256(der).hexdigest()


def claimed_fingerprint(pem: object) -> str:
    """The fingerprint of the DER bytes a PEM text holds, without reading them as a
    certificate (the pairing's proof is checked against it before anything else of the
    request is read); "" when it is not PEM at all."""
    if not isinstance(pem, str) or not 0 < len(pem) < 16384:
        return ""
    try:
        return fingerprint_der(ssl.PEM_cert_to_DER_cert(pem))
    except ValueError:  # no PEM markers, or base64 that is not (binascii.Error)
        return ""


def fingerprint_pem(pem: str) -> str:
    """The fingerprint of a PEM certificate; ConfigError when it is not one."""
    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
    except ValueError as exc:
        raise ConfigError(f"not a PEM certificate ({exc})") from None
    return fingerprint_der(cert.public_bytes(serialization.Encoding.DER))


def shown(fingerprint: str) -> str:
    """A fingerprint as people compare it: upper-case hex in groups of four."""
    up = fingerprint.upper()
    return "-".join(up[i : i + 4] for i in range(0, len(up), 4))


def load_or_create(folder: Path, common_name: str) -> Identity:
    """The identity in ``folder``, made there first if it has none (blocking: call in a
    thread). The key is written 0600 before the certificate, so a half-made identity (a key
    without its certificate) is made again rather than used; two processes making one at once
    take turns (a lock file in the folder), so neither ends with the other's key beside its
    certificate."""
    cert_file, key_file = folder / CERT_FILE, folder / KEY_FILE
    if cert_file.exists() and key_file.exists():
        return _identity(cert_file, key_file)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with (folder / LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (cert_file.exists() and key_file.exists()):  # the other made it meanwhile
            _create(cert_file, key_file, common_name)
    return _identity(cert_file, key_file)


def _identity(cert_file: Path, key_file: Path) -> Identity:
    pem = cert_file.read_text()
    return Identity(pem, cert_file, key_file, fingerprint_pem(pem))


def _create(cert_file: Path, key_file: Path, common_name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    write_bytes_atomic(
        key_file,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        mode=0o600,
    )
    write_bytes_atomic(cert_file, _self_signed(key, common_name), mode=0o644)


def _self_signed(key: ec.EllipticCurvePrivateKey, common_name: str) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"traylm {common_name}"[:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def server_context(identity: Identity, pinned: Iterable[str]) -> ssl.SSLContext:
    """The peer listener's context: this box's certificate; a client certificate is asked
    for and, when one is sent, must be one of ``pinned`` (PEM) or the handshake fails. A
    client without one gets through TLS only to the pairing route (routes.py checks)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(identity.cert_file, identity.key_file)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    trust(ctx, pinned)
    return ctx


def trust(ctx: ssl.SSLContext, pinned: Iterable[str]) -> None:
    """Add pinned certificates to a context's trust store (handshakes from now on see them;
    a store cannot forget one, so an unpaired box is refused by routes.py's check)."""
    pems = "".join(pinned)
    if pems:
        ctx.load_verify_locations(cadata=pems)


def client_context(identity: Identity | None, peer_cert_pem: str | None) -> ssl.SSLContext:
    """A client context that trusts only ``peer_cert_pem`` (no host name check: the pin is
    the check) and presents ``identity``'s certificate. A pairing's first contact trusts
    nothing yet (``peer_cert_pem`` None: it reads the certificate it is shown) and presents
    none (``identity`` None: the other box does not know it yet)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    if peer_cert_pem is None:
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=peer_cert_pem)
    if identity is not None:
        ctx.load_cert_chain(identity.cert_file, identity.key_file)
    return ctx


def pem_of(der: bytes) -> str:
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM).decode()
