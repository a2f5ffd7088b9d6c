"""How much work probing may spend per kernel, counted in work done, never in seconds.

Recognising a kernel is a search: readings of its op list (or of known fusions, for a kernel whose
name says nothing), attribute settings for each step, each candidate computed in PyTorch and compared
with what the kernel computed. A search that is cut short may miss the reading that matches, so where
it stops is part of the answer. A wall-clock deadline made that answer depend on how busy the machine
was (issue 36: a kernel reproduced on a quiet machine was "not reproduced" on a loaded one). These
limits count work instead: candidate computations evaluated (trials) and complete readings compared
(leaves). The same library and the same limits give the same search, on any machine, at any load.

They are set with `zen decompile --limit NAME=VALUE` and recorded in the package's manifest.json
(`limits`), so a result says what it was bounded by. Stdlib only: the probing child reads them too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Seconds each child of `zen decompile` (importing TVM, probing, checking) may run: a safety net against a
# child that never ends, far above what the work limits below allow on a loaded 2-core machine. Running
# out of it stops zen with an error naming it (exit 7); it is never part of a result (`--timeout`).
TIMEOUT = 1800.0


@dataclass(frozen=True)
class SearchLimits:
    """The bounds of one kernel's search. Defaults, from the 25 libraries of bench/decompile.py (measured with
    no limit): a kernel recognised from its name needed at most 5,606 trials (MobileNetV3-Small), one read by
    behaviour at most 13,136 (fusion patterns included, leave-one-out as bench/decompile_behaviour.py reads
    them); GhostNet's kernels that no pattern reproduces exhaust all patterns after 120,000-143,000 trials.
    A trial costs 0.03-0.4 ms there, so an unrecognisable kernel stops after seconds to a minute."""

    # candidate computations evaluated for one kernel over the readings of its name (every reading and
    # attribute setting tried counts one), or over single operators when the name says nothing
    kernel_trials: int = 100_000
    # complete readings compared (leaves of the search) per reading list of one kernel
    kernel_leaves: int = 4000
    # candidate computations evaluated for one kernel over all known fusion patterns together, tried
    # when its name says nothing (--behaviour-only, hashed names) and no single operator matched
    pattern_trials: int = 100_000
    # complete readings compared per fusion pattern, so that no one pattern spends the others' share
    pattern_leaves: int = 2000

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict | None) -> SearchLimits:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in (data or {}).items() if k in known})


class Budget:
    """Work left to one search: `trials` is shared by every reading searched under it; `leaves`
    bounds each reading list searched (a pattern, the readings of a name) on its own."""

    def __init__(self, trials: int, leaves: int, name: str, leaves_name: str) -> None:
        self.trials, self.leaves = trials, leaves
        self.name, self.leaves_name = name, leaves_name  # the limits, as a user raises them
        self.spent = 0
        self.leaves_hit = False  # some reading list stopped at `leaves`

    @classmethod
    def for_kernel(cls, limits: SearchLimits) -> Budget:
        return cls(limits.kernel_trials, limits.kernel_leaves, "kernel_trials", "kernel_leaves")

    @classmethod
    def for_patterns(cls, limits: SearchLimits) -> Budget:
        return cls(limits.pattern_trials, limits.pattern_leaves, "pattern_trials", "pattern_leaves")

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.trials

    def spend(self) -> None:
        self.spent += 1

    def stopped(self) -> str:
        """What cut the search short, named as the limit to raise ('' when nothing did)."""
        hit = [f"{self.name}={self.trials:,}"] if self.exhausted else []
        hit += [f"{self.leaves_name}={self.leaves:,}"] if self.leaves_hit else []
        return ", ".join(hit)
