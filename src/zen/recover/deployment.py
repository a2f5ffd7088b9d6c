"""The deployment form's steps of a PyTorch recovery: which roots are served, the eager module inside a
`torch.compile` wrapper, offloaded tensors, and the audit of state the eager reader did not read (`forms.audit`).

Kept apart from `run.py` so the command reads as its stages; each step is small and names the front-end module that
does the work."""

from __future__ import annotations

from zen.frontends.common import NoModelFound
from zen.frontends.pytorch.mr import root_record


def served(ip, heap, index, roots) -> None:
    """Which roots running code uses (served), and which are merely alive: served ones rank first. A compile wrapper's
    use counts for the module inside it."""
    from zen.frontends.common import served

    evidence = served(ip, heap, {int(r.address, 16) for r in roots})
    for r in roots:
        r.served_by = evidence.get(int(r.address, 16), [])


def no_model(space, sessions: list[str], why: str) -> None:
    if sessions:
        raise NoModelFound(f"an ONNX Runtime session holds the model in {space.description} ({sessions[0]}); "
                           f"zen does not read ONNX Runtime's C++ state, and {why}",
                           "recover the model from the ONNX file the session loaded, or from the exporting process")  # fmt: skip
    raise NoModelFound(f"no PyTorch models found in {space.description}: {why}")


def unwrap_form(ip, index, reader, chosen, how, refs):
    """A `torch.compile` wrapper is recovered as the eager module it wraps (keys as in eager), with the
    compilation recorded in mr.json's `deployment`."""
    from zen.frontends.pytorch.forms import unwrap_compiled

    got = unwrap_compiled(ip, index, int(chosen.address, 16))
    if got is None:
        return chosen, how, {}
    inner, info = got
    rec = root_record(index, reader, inner, chosen.referenced_from)  # the wrapper's references and rank are the model's
    rec.rank = chosen.rank
    return rec, f"{how}, the eager module inside torch.compile's wrapper", info


def offloaded(ip, reader, index, mr, slots, space, files) -> None:
    """Meta tensors of an accelerate-offloaded model: read from the hook's in-memory map, or named (the file), or
    read from the files given with --offload (recorded in the evidence)."""
    from zen.frontends.pytorch.offload import resolve

    if not any(s.meta is not None and s.meta.device == "meta" for s in slots):
        return
    mr.problems += resolve(ip, reader, index, int(mr.root.address, 16), slots)
    if files:
        from zen.frontends.pytorch.offload_files import attach

        space.offload_evidence, problems = attach(reader, slots, files)
        mr.problems += problems
    mr.tensors = [s.record for s in slots]


def audit_form(ip, reader, index, mr, slots, tensor_types) -> None:
    """State of the model that the eager reader did not read (`forms.audit`) becomes problems: never complete."""
    from zen.frontends.pytorch.forms import audit

    unread, parts = audit(ip, reader, index, int(mr.root.address, 16), slots, tensor_types)
    mr.unread = [u.to_json() for u in unread]
    mr.problems += [u.problem() for u in unread]
    slots += parts  # the inner tensors of subclasses, written to the weights file like state_dict tensors
    mr.tensors += [s.record for s in parts]


def scripted(ip, index, reader, tprof, roots, refs):
    """The TorchScript roots' C++ trees (`torchscript.models`), or None when no root is scripted."""
    from zen.frontends.pytorch.torchscript.models import script_models

    return script_models(ip, index, reader, tprof, [int(r.address, 16) for r in roots])
