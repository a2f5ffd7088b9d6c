"""Signed cases: an Ed25519 signature over manifest.json, so that a rewritten manifest is caught.

The manifest pins every case file by sha256 and every file is checked against it (and against mr.json), but a
person with write access can rewrite the manifest too. A signature made with the investigator's or the lab's key
when the case is written (`zen recover --sign KEY`, or `zen sign CASE --key KEY` later) binds the manifest's exact
bytes to that key: `zen verify-case CASE --key KEY.pub` and `zen report` say who signed, and whether the signature
holds. `manifest.sig` (JSON) carries the algorithm, the public key, its fingerprint and the signature. Keys are
PEM files made by `zen keygen` (or any Ed25519 key in PEM/OpenSSH form).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from zen.runtime.errors import ZenError

SIG_FILE = "manifest.sig"
MAX_SIG = 64 << 10


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ZenError("signing and checking signatures needs the cryptography package", "pip install cryptography") from None
    return ed25519, serialization, InvalidSignature


def keygen(path: Path) -> tuple[Path, Path]:
    """Write a new Ed25519 private key (mode 0600) and PATH.pub; returns both paths."""
    ed25519, serialization, _ = _crypto()
    path = Path(path)
    if path.exists() or Path(f"{path}.pub").exists():
        raise ZenError(f"{path} or {path}.pub already exists", "choose another name: zen never overwrites a key")
    if not path.parent.is_dir():
        raise ZenError(f"directory {path.parent} does not exist", "create it first")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    Path(f"{path}.pub").write_bytes(pub)
    return path, Path(f"{path}.pub")


def _load_private(path: Path):
    ed25519, serialization, _ = _crypto()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ZenError(f"cannot read the signing key {path}: {exc.strerror}") from None
    try:
        key = (serialization.load_ssh_private_key(data, None) if b"OPENSSH" in data[:64]
               else serialization.load_pem_private_key(data, None))  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise ZenError(f"{path} is not an unencrypted private key: {exc}", "make one with `zen keygen -o KEY`") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ZenError(f"{path} is not an Ed25519 key", "make one with `zen keygen -o KEY`")
    return key


def _raw_public(key) -> bytes:
    _, serialization, _ = _crypto()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_public(path: Path) -> bytes:
    """The raw 32-byte Ed25519 public key of a PEM/OpenSSH public key file (or of a private key file)."""
    ed25519, serialization, _ = _crypto()
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ZenError(f"cannot read the key {path}: {exc.strerror}") from None
    try:
        if data.startswith(b"ssh-ed25519"):
            key = serialization.load_ssh_public_key(data)
        elif b"PRIVATE KEY" in data[:80]:
            return _raw_public(_load_private(path).public_key())
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ZenError(f"{path} is not a public key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ZenError(f"{path} is not an Ed25519 public key")
    return _raw_public(key)


def fingerprint(raw_public: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw_public).digest()).decode().rstrip("=")


def sign_case(case_dir: Path, key_path: Path) -> dict:
    """Sign the case's manifest.json with the private key; writes manifest.sig and returns its contents."""
    key = _load_private(key_path)
    manifest = (Path(case_dir) / "manifest.json").read_bytes()
    raw = _raw_public(key.public_key())
    sig = {"format": 1, "kind": "zen-case-signature", "algorithm": "ed25519", "signs": "manifest.json",
           "manifest_sha256": hashlib.sha256(manifest).hexdigest(), "public_key": base64.b64encode(raw).decode(),
           "key_fingerprint": fingerprint(raw), "signature": base64.b64encode(key.sign(manifest)).decode()}  # fmt: skip
    (Path(case_dir) / SIG_FILE).write_text(json.dumps(sig, indent=1) + "\n")
    return sig


def check_signature(case_dir: Path, trusted: bytes | None = None) -> dict:
    """{"status": "unsigned"|"valid"|"invalid"|"untrusted", "reason", "key_fingerprint"} for the case's manifest.

    "valid" means the signature holds for the manifest's bytes; with `trusted` (a raw public key) the signing key
    must also be that one ("untrusted" otherwise)."""
    ed25519, _, InvalidSignature = _crypto()
    p = Path(case_dir) / SIG_FILE
    if not p.exists():
        return {"status": "unsigned", "reason": "the case is not signed (zen recover --sign KEY, or zen sign)"}
    try:
        if p.stat().st_size > MAX_SIG:
            raise ValueError("too large")
        sig = json.loads(p.read_bytes())
        raw = base64.b64decode(sig["public_key"], validate=True)
        signature = base64.b64decode(sig["signature"], validate=True)
        public = ed25519.Ed25519PublicKey.from_public_bytes(raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"status": "invalid", "reason": f"{SIG_FILE} is malformed ({type(exc).__name__})"}
    manifest = (Path(case_dir) / "manifest.json").read_bytes()
    try:
        public.verify(signature, manifest)
    except InvalidSignature:
        return {"status": "invalid", "key_fingerprint": fingerprint(raw),
                "reason": "the signature does not match manifest.json: the manifest was changed after signing"}  # fmt: skip
    if trusted is not None and raw != trusted:
        return {"status": "untrusted", "key_fingerprint": fingerprint(raw),
                "reason": f"signed by {fingerprint(raw)}, not by the key given ({fingerprint(trusted)})"}  # fmt: skip
    return {"status": "valid", "key_fingerprint": fingerprint(raw),
            "reason": f"manifest.json signed by {fingerprint(raw)}" + (" (the key given)" if trusted else "")}  # fmt: skip
