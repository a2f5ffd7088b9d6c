"""What a case records of its evidence: the image's sha256 (computed beside the analysis, or reused from the digest
cache), the GPU images', and how the evidence was read (producer, live PID, system image, offload files, notes)."""

from __future__ import annotations

from pathlib import Path

from zen.evidence.image_digest import ImageDigest


class Digests:
    """The sha256 of the host image and of each GPU image, computed beside the analysis (or reused)."""

    def __init__(self, image: Path | None, gpu: list[Path], rehash: bool = False, display=None) -> None:
        self.host = ImageDigest(Path(image), rehash=rehash) if image is not None and Path(image).is_file() else None
        self.gpu = [ImageDigest(Path(g), rehash=rehash) for g in gpu]
        self.display = display

    def timings(self) -> dict[str, float]:
        """How long computing the digests took (beside the analysis) and how long recovery waited for them."""
        all_ = [h for h in [self.host, *self.gpu] if h is not None]
        return {"digest": max((h.seconds for h in all_), default=0.0), "digest_wait": sum(h.waited for h in all_)}

    def cancel(self) -> None:
        for h in [self.host, *self.gpu]:
            if h is not None:
                h.cancel()

    def result(self) -> tuple[str | None, str | None]:
        return self.host.result(self.display) if self.host else (None, None)


def gpu_evidence(space, hasher: Digests) -> list[dict]:
    out = []
    for ev, h in zip(space.device_evidence, hasher.gpu):
        digest, error = h.result(hasher.display)
        out.append({**ev, "sha256": digest, "sha256_provenance": h.provenance, **({"sha256_error": error} if error else {})})
    return out


def evidence(space, image, pid, hasher: Digests) -> dict:
    gpu = gpu_evidence(space, hasher) if getattr(space, "device_evidence", None) else []
    if image is None:
        ev = {"live_pid": pid, "note": "read from a live process (stopped while read); no image file to hash"}
        return {**ev, "gpu": gpu} if gpu else ev
    p = Path(image)
    digest, error = hasher.result()
    ev = {"image": str(p.resolve()), "size": p.stat().st_size, "sha256": digest,
          "sha256_provenance": hasher.host.provenance if hasher.host else None}  # fmt: skip
    if gpu:
        ev["gpu"] = gpu
    info = getattr(space, "info", None)
    if info is not None:
        ev.update(producer=info.producer, pid=info.pid, command=info.command, acquisition=info.acquisition)
    system = getattr(space, "system", None)
    if system is not None:
        ev["system"] = system
    if getattr(space, "offload_evidence", None):  # files given with --offload that tensors were read from
        ev["offload"] = space.offload_evidence
    if space.notes:  # how the evidence was completed (e.g. pages read from mapped files on disk)
        ev["notes"] = list(space.notes)
    if error:
        ev["sha256_error"] = error
    return ev
