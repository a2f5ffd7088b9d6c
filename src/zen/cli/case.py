"""Commands about a case as evidence: `zen verify-case` (one verdict per file), `zen sign`, `zen keygen`.

A court asks whether the case is the one zen wrote from the image: every file is hashed again (no digest is
taken from zen's cache here) and checked against the manifest's sha256 and against the others (mr.json's per-tensor
sha256 for each tensor file, typed and bounded JSON, code.marshal loaded in an isolated child), and, where the case
is signed, the manifest against the signature.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.runtime.console import consoles

out, err = consoles()
EXIT_FAILED = 1


def verify_case(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    key: Path | None = typer.Option(None, "--key", help="Public key the case must be signed with (PEM or OpenSSH)."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON."),
) -> None:
    """One verdict per case file (hash, contents, agreement with mr.json; every file hashed now, no digest reused) and
    the signature; exit 1 if any fails."""
    from zen.represent import case
    from zen.represent.signature import check_signature, load_public

    # the signature is one of the verdicts below; the schema is checked afresh (no memo), as every digest is
    manifest = case.load_manifest(case_dir, signature=False, memo=False)
    verdicts = case.verdicts(case_dir, manifest, code=True, rehash=True)  # every digest computed now, none reused
    sig = check_signature(case_dir, load_public(key) if key is not None else None)
    failed = [v for v in verdicts.values() if v.status not in ("ok", "missing", "unchecked")]
    sig_bad = sig["status"] in ("invalid", "untrusted") or (key is not None and sig["status"] != "valid")
    if as_json:
        files = {n: {"status": v.status, "reasons": v.reasons} for n, v in verdicts.items()}
        out.print_json(json.dumps({"case": str(case_dir), "files": files, "signature": sig, "ok": not failed and not sig_bad}))
    else:
        t = Table("file", "verdict", "detail")
        digest = case.verified_sha256(Path(case_dir) / case.MANIFEST)
        t.add_row(case.MANIFEST, "[green]ok[/green]", f"schema-checked; sha256 {digest}")
        for name, v in verdicts.items():
            if v.status == "missing" and not v.reasons:
                continue  # not written by this recovery (no extra tensors, ...)
            colour = {"ok": "green", "unchecked": "yellow"}.get(v.status, "red")
            detail = "; ".join(v.reasons[:3]) or ("sha256 and contents verified" if v.status == "ok" else "")
            t.add_row(name, f"[{colour}]{v.status}[/{colour}]", escape(detail))
        out.print(t)
        colour = {"valid": "green", "unsigned": "yellow"}.get(sig["status"], "red")
        out.print(f"signature: [{colour}]{sig['status']}[/{colour}] ({escape(sig['reason'])})")
    if failed or sig_bad:
        raise typer.Exit(EXIT_FAILED)


def sign(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    key: Path = typer.Option(..., "--key", help="Ed25519 private key (PEM or OpenSSH, unencrypted; `zen keygen`)."),
) -> None:
    """Sign the case's manifest (manifest.sig): a later change to the manifest, and so to any file, is detected."""
    from zen.represent import case
    from zen.represent.signature import sign_case
    from zen.runtime.errors import ZenError

    manifest = case.load_manifest(case_dir, signature=False)  # re-signing replaces an old signature
    bad = case.integrity(case_dir, manifest, code=True, rehash=True)
    if bad:
        raise ZenError(f"refusing to sign {case_dir}: {bad[0]}", "only a case that verifies can be signed (zen verify-case)")
    sig = sign_case(case_dir, key)
    out.print(f"signed {escape(str(case_dir))}/manifest.json (sha256 {sig['manifest_sha256']}) with {sig['key_fingerprint']}")


def keygen(output: Path = typer.Option(..., "-o", "--output", help="Private key file to write (PATH.pub beside it).")) -> None:
    """Make an Ed25519 key pair for signing cases (the private key is written with mode 0600)."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the key")
    from zen.represent import signature

    priv, pub = signature.keygen(output)
    fp = signature.fingerprint(signature.load_public(pub))
    out.print(f"wrote {escape(str(priv))} (private, keep it safe) and {escape(str(pub))}; fingerprint {fp}")


def verify_evidence(
    images: list[Path] = typer.Argument(..., help="Evidence files (images, GPU cores) to hash again."),
    case_dir: Path | None = typer.Option(None, "--case", help="Also compare with the digests this case's manifest records."),
) -> None:
    """Recompute each file's sha256 and compare it with the digest zen recorded for it (its digest cache) and, with
    --case, with the case's manifest; exit 1 on any difference."""
    from zen.evidence import digest_cache
    from zen.memory import require_image_file

    recorded: dict[str, str] = {}
    if case_dir is not None:
        from zen.represent import case

        ev = case.load_manifest(case_dir).get("evidence") or {}
        recorded = {str(ev.get("image")): ev.get("sha256"), **{g.get("path"): g.get("sha256") for g in ev.get("gpu") or []}}
    bad = 0
    for image in images:
        require_image_file(image)
        key = digest_cache.stat_key(image)
        cached = digest_cache.lookup(image)
        digest = digest_cache.file_sha256(image)
        digest_cache.remember(image, digest, key)
        checks = []
        if cached is not None:
            checks.append(("zen's record", cached["sha256"], cached["how"]))
        want = recorded.get(str(Path(image).resolve()))
        if case_dir is not None:
            checks.append(("the case's manifest", want, str(case_dir)))
        out.print(f"{escape(str(image))}: sha256 {digest}")
        for what, value, detail in checks:
            same = value == digest
            bad += not same
            mark = "[green]matches[/green]" if same else "[red]DIFFERS from[/red]"
            out.print(f"  {mark} {what} ({escape(str(value))}; {escape(detail)})")
        if not checks:
            out.print("  no earlier digest recorded for this file in its present state (now recorded)")
    if bad:
        raise typer.Exit(EXIT_FAILED)
