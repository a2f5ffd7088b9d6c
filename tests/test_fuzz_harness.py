"""The fuzz harness of bench/fuzz.py on a short budget (the long run is the bench, issue 20).

Hypothesis draws the seeds; each seed is one structure-aware mutation of a real artefact (the demo's
deployed-model image and its recovered case). Nothing but zen's typed errors may escape, and no
input may run past its target's time limit.
"""

from __future__ import annotations

import subprocess
import sys

import fuzz
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    res = subprocess.run([sys.executable, "-m", "zen", "demo", "--dir", str(work / "demo"), "--keep"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    yield work, work / "demo" / "deployed.core", work / "demo" / "case"
    for p in [*(work / "demo").glob("*.core"), *work.glob("*.core")]:
        p.unlink()


@pytest.fixture(scope="module")
def targets(artefacts):
    work, image, case = artefacts
    return {"objects": fuzz.ObjectsTarget(image), "case": fuzz.CaseTarget(case, work),
            "elf": fuzz.ElfTarget(image, work), "containers": fuzz.ContainersTarget(image, work)}  # fmt: skip


BUDGET = {"objects": 400, "case": 60, "elf": 30, "containers": 150}


@pytest.mark.parametrize("name", sorted(BUDGET))
def test_no_crash_no_hang(targets, name):
    target = targets[name]
    tally = fuzz.Tally(name)

    @settings(max_examples=BUDGET[name], deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
    @given(seed=st.integers(0, 2**32 - 1))
    def one(seed):
        tally.run(target, seed, target.limit)

    one()
    assert tally.runs >= BUDGET[name] // 2
    assert not tally.crashes, tally.crashes[:5]
    assert not tally.hangs, tally.hangs[:5]
    if name == "objects":  # the mutations reach the readers: typed errors are raised, not swallowed early
        assert sum(target.errors.values()) > tally.runs
    if name in ("case", "elf"):  # most mutations are rejected with a clear error, some still load
        assert len(tally.outcomes) >= 2, tally.outcomes


def test_recover_cli_on_mutated_images(artefacts):
    work, image, _ = artefacts
    codes, bad, _ = fuzz.recover_runs(image, work, 3, seed=11)
    assert sum(codes.values()) == 3
    assert not bad, bad
    assert all(isinstance(c, int) and c in (0, 2, 3, 4, 5, 6) for c in codes), codes
