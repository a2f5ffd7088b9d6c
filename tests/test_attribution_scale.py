"""Attribution at scale (issue 16): the fast path gives exactly the reference's results.

Attribution now reads per-entry invariants stored at `library add` (MR features, Laplacian
spectrum, code views and content-addressed code bodies) and matches code with vectorised
matrices. These tests hold it to the per-pair reference implementation (the algorithm as it ran
before) on real fingerprints recovered from imaged processes: same candidates, same order, every
score equal to the last bit, same explanation. They also check the schema-4 migration of an older
library and that removing entries collects the code bodies no other entry refers to.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3

import numpy as np
import pytest
from bench_attribution_scale import perturb_mr, perturb_pr
from conftest import BASES, case_of, zen
from library_checks import posting_problems

from zen.attribute.algorithm import FULL_COMPARE, attribute, primary_modules
from zen.attribute.blas import _openblas_apis, one_thread
from zen.attribute.code_views import MatchResult
from zen.attribute.invariants import invariants, mr_features, mr_score, packed, unpack_mr, unpack_views
from zen.attribute.mr_similarity import mr_similarity
from zen.attribute.parallel_compare import SentMatch
from zen.attribute.pr_similarity import code_similarity, views
from zen.library import postings
from zen.library.store import MIGRATIONS, SCHEMA_VERSION, Library, LibraryError
from zen.represent import case
from zen.represent.mr import ModelMR
from zen.represent.pr import ProgrammaticRepresentation

FORKS = {"convnet_se": "convnet", "convnet_renamed": "convnet", "mobile_ghost": "mobile", "gptmini_lora": "gptmini",
         "lora": "hf", "mistral": "hf"}  # fmt: skip


def _raw(att) -> list:
    return [(c.name, c.method, c.mr.arch, c.mr.ts, c.mr.op, c.mr.graph, c.cos, c.cls, c.optimal_cos, c.shared)
            for c in att.candidates]  # fmt: skip


def _same(fast, ref) -> None:
    assert fast.attributed == ref.attributed
    assert _raw(fast) == _raw(ref)  # every score to the last bit
    assert fast.to_json() == ref.to_json() and fast.explanation == ref.explanation


def _loaded(name, source, family_images, hf_image, workdir):
    c = case_of(name, source, family_images, hf_image, workdir)
    return case.load_mr(c), case.load_pr(c), case.load_ur(c)


@pytest.fixture(scope="module")
def scale_library(base_library, family_images, hf_image, workdir, tmp_path_factory):
    """The five real bases plus seeded perturbed copies of each: more than FULL_COMPARE candidates
    share code with every fork, so both fully compared and index-estimated candidates occur."""
    path = tmp_path_factory.mktemp("scale") / "scale.sqlite"
    with Library(path, invariants=packed) as lib:
        for name, source in BASES.items():
            mr, pr, ur = _loaded(name, source, family_images, hf_image, workdir)
            lib.add(name, mr, pr, ur)
            for k in range(1, 12 if name == "convnet" else 3):
                rng = random.Random(f"test:{name}:{k}")
                pmr, ppr = perturb_mr(mr.to_json(), rng), perturb_pr(pr.to_json(), rng)
                lib.add(f"{name}~{k}", ModelMR.from_json(pmr), ProgrammaticRepresentation.from_json(ppr), ur)
    return path


@pytest.mark.parametrize("fork", sorted(FORKS))
def test_fast_attribution_equals_reference(scale_library, family_images, hf_image, workdir, fork):
    mr, pr, _ = _loaded(fork, FORKS[fork], family_images, hf_image, workdir)
    with Library(scale_library, invariants=packed) as lib:
        fast, ref = attribute(mr, pr, lib), attribute(mr, pr, lib, reference=True)
    _same(fast, ref)
    assert {c.method for c in fast.candidates} >= {"algorithm-1"}
    if fork == "convnet_se":  # shares code with all 12 ConvNet entries: index estimates are compared too
        assert sum(c.method == "index estimate" for c in fast.candidates) == len(fast.candidates) - FULL_COMPARE > 0


def test_no_shared_code_equals_reference(scale_library, zoo_image, workdir):
    from conftest import recovered

    c = recovered(*zoo_image, "cnn", workdir)[0]
    with Library(scale_library, invariants=packed) as lib:
        fast = attribute(case.load_mr(c), case.load_pr(c), lib)
        ref = attribute(case.load_mr(c), case.load_pr(c), lib, reference=True)
    assert fast.attributed is None and fast.message == ref.message
    _same(fast, ref)


@pytest.mark.parametrize("pair", [("convnet_se", "convnet"), ("mistral", "llama"), ("gpt2", "llama"), ("lora", "gpt2")])
def test_matching_equals_reference(family_images, hf_image, workdir, pair):
    """Vectorised greedy and optimal matching pair the same code objects with the same scores."""
    src = {**{k: v for k, v in FORKS.items()}, **BASES}
    (a_mr, a_pr, _), (b_mr, b_pr, _) = (_loaded(n, src[n], family_images, hf_image, workdir) for n in pair)
    da, db = views(a_pr, primary_modules(a_mr)), views(b_pr, primary_modules(b_mr))
    fast, ref = code_similarity(da, db), code_similarity(da, db, reference=True)

    def flat(m):
        return ([(p.recovered.address, p.base.address, p.score, p.attr, p.ibss, p.exact, p.weight) for p in m.pairs],
                [c.address for c in m.added], [c.address for c in m.unmatched_base], m.cos, m.optimal_cos)  # fmt: skip

    assert flat(fast) == flat(ref)
    assert any(not p.exact for p in fast.pairs)  # the fuzzy path was exercised


def test_stored_invariants_equal_computed(scale_library, family_images, hf_image, workdir):
    """Features and views read back from the library equal those computed from the entry; mr_score
    equals mr_similarity on real pairs, stored or not."""
    names = ["convnet", "gpt2", "llama", "mobile"]
    loaded = {n: _loaded(n, BASES[n], family_images, hf_image, workdir) for n in names}
    with Library(scale_library, invariants=packed) as lib:
        rows = {r.name: r for r in lib.mr_invariants(names)}
        for n in names:
            mr, pr, _ = loaded[n]
            feats, lv = unpack_mr(rows[n].mr, rows[n].spectrum)
            assert lv == pr.listing_version and (feats.spectrum == mr_features(mr).spectrum).all()
            for m in names:
                assert mr_score(mr_features(loaded[m][0]), feats) == mr_similarity(loaded[m][0], mr)
            stored = unpack_views(lib.views_blob(n)[1], lib.code_bodies)
            fresh = views(pr, primary_modules(mr))
            assert [(v.key, v.text, v.attrs, v.vector, v.model_code, v.weight, v.rec.address, v.rec.qualname,
                     v.rec.module, v.rec.owner_class) for v in stored] == [
                (v.key, v.text, v.attrs, v.vector, v.model_code, v.weight, v.rec.address, v.rec.qualname,
                 v.rec.module, v.rec.owner_class) for v in fresh]  # fmt: skip


def _v3_library(path, source) -> None:
    """A library as zen wrote it with schema 3 (before the invariants), holding `source`'s entries."""
    db = sqlite3.connect(path)
    for version in range(3):
        for stmt in MIGRATIONS[version]:
            db.execute(stmt)
    db.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    src = sqlite3.connect(source)
    cols = "id, name, created, source_sha256, python, torch, root_class, summary, mr, pr, ur, notes, code"
    db.executemany(f"INSERT INTO models({cols}) VALUES ({','.join('?' * 13)})", src.execute(f"SELECT {cols} FROM models"))
    db.executemany("INSERT INTO code_hashes VALUES (?,?,?,?)", src.execute("SELECT model_id, kind, hash, code FROM code_hashes"))
    db.commit()
    db.close()
    src.close()


def test_schema_3_library_migrated(tmp_path, scale_library, family_images, hf_image, workdir):
    """Opening a schema-3 library computes every entry's invariants; attribution on it is the same
    as on a library built by this zen, and the same as the reference."""
    old = tmp_path / "v3.sqlite"
    _v3_library(old, scale_library)
    with Library(old, invariants=packed) as lib:
        assert lib.schema_version() == SCHEMA_VERSION == 6 and posting_problems(lib) == []
        n = len(lib)
        assert lib.db.execute("SELECT COUNT(*) FROM invariants").fetchone()[0] == n
        assert lib.db.execute("SELECT COUNT(DISTINCT model_id) FROM code_body_refs").fetchone()[0] == n
        indexes = {r[0] for r in lib.db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "code_hashes_cover" in indexes and "code_hashes_lookup" not in indexes
        mr, pr, _ = _loaded("convnet_se", "convnet", family_images, hf_image, workdir)
        migrated = attribute(mr, pr, lib)
        _same(migrated, attribute(mr, pr, lib, reference=True))
    with Library(scale_library, invariants=packed) as lib:
        _same(migrated, attribute(mr, pr, lib))


def test_entry_without_invariants_falls_back(tmp_path, scale_library, family_images, hf_image, workdir):
    """An entry whose invariants are missing or of another version is decoded per query, same result."""
    import shutil

    path = tmp_path / "partial.sqlite"
    shutil.copy(scale_library, path)
    with Library(path, invariants=packed) as lib:
        lib.db.execute("DELETE FROM invariants WHERE model_id = (SELECT id FROM models WHERE name='convnet')")
        lib.db.execute("UPDATE invariants SET version = version + 100 WHERE model_id = "
                       "(SELECT id FROM models WHERE name='convnet~1')")  # fmt: skip
        mr, pr, _ = _loaded("convnet_se", "convnet", family_images, hf_image, workdir)
        _same(attribute(mr, pr, lib), attribute(mr, pr, lib, reference=True))
        assert attribute(mr, pr, lib).attributed == "convnet"


def test_remove_and_replace_collect_code_bodies(tmp_path, family_images, hf_image, workdir):
    mr, pr, ur = _loaded("convnet", "convnet", family_images, hf_image, workdir)
    smr, spr, sur = _loaded("convnet_se", "convnet", family_images, hf_image, workdir)
    with Library(tmp_path / "gc.sqlite", invariants=packed) as lib:

        def bodies() -> int:
            return lib.db.execute("SELECT COUNT(*) FROM code_bodies").fetchone()[0]

        lib.add("a", mr, pr, ur)
        alone = bodies()
        lib.add("b", smr, spr, sur)
        both = bodies()
        assert both > alone  # the fork's changed and added code
        lib.add("c", mr, pr, ur)
        assert bodies() == both  # identical code is stored once
        lib.remove("a")
        assert bodies() == both  # still referred to by c
        lib.add("c", smr, spr, sur, replace=True)
        assert bodies() < both  # a's code, now unreferenced, is gone; b's and c's kept
        lib.remove("b")
        lib.remove("c")
        assert bodies() == 0 and lib.db.execute("SELECT COUNT(*) FROM code_body_refs").fetchone()[0] == 0


def test_invariants_pack_is_deterministic(family_images, hf_image, workdir):
    mr, pr, _ = _loaded("gptmini", "gptmini", family_images, hf_image, workdir)
    a, b = invariants(mr, pr).pack(), invariants(mr, pr).pack()
    assert a == b
    assert json.loads(__import__("zlib").decompress(a[0][1]))["listing_version"] == pr.listing_version


def test_one_thread_restores_blas_threads():
    import numpy as np

    before = [get() for get, _ in _openblas_apis()]
    with one_thread():
        assert all(get() == 1 for get, _ in _openblas_apis())
        np.linalg.eigvalsh(np.eye(3))
    assert [get() for get, _ in _openblas_apis()] == before


def test_same_code_family_is_told_apart_by_architecture(family_images, hf_image, workdir, tmp_path):
    """A family whose sizes share exactly the same code (torchvision's 15 RegNets): more than
    FULL_COMPARE entries tie on shared code. The query's own entry sorts last by name; ranked by
    name alone it fell outside the full comparison (tv_regnet_y_32gf was attributed to
    tv_regnet_y_16gf at UR 0.955); ranked by MR similarity after the code share it is compared in
    full and wins at UR 1.0, in the fast path and in the reference alike."""
    mr, pr, ur = _loaded("convnet", BASES["convnet"], family_images, hf_image, workdir)
    with Library(tmp_path / "family.sqlite", invariants=packed) as lib:
        for k in range(FULL_COMPARE + 2):  # same code, other sizes
            pmr = perturb_mr(mr.to_json(), random.Random(f"family:{k}"))
            lib.add(f"a_size{k:02d}", ModelMR.from_json(pmr), pr, ur)
        lib.add("z_self", mr, pr, ur)
        fast, ref = attribute(mr, pr, lib), attribute(mr, pr, lib, reference=True)
    _same(fast, ref)
    best = fast.candidates[0]
    assert fast.attributed == "z_self" and best.method == "algorithm-1" and best.ur == 1.0


def test_sharing_counts_equal_a_count_of_the_stored_rows(scale_library, family_images, hf_image, workdir):
    """Candidate selection's counts (one grouped query per 500 hashes) are, per entry, the number of
    the query's distinct listing hashes that entry stores: counted here row by row from the table
    (a transformers query: several chunks of hashes, entries sharing different amounts)."""
    _, pr, _ = _loaded("lora", FORKS["lora"], family_images, hf_image, workdir)
    hashes = {c.listing_sha256 for c in pr.codes}
    with Library(scale_library, invariants=packed) as lib:
        got = lib.sharing("listing", hashes)
        rows = lib.query("SELECT m.name, h.hash FROM code_hashes h JOIN models m ON m.id = h.model_id WHERE h.kind='listing'")
        want: dict[str, set] = {}
        for name, h in rows.fetchall():
            if h in hashes:
                want.setdefault(name, set()).add(h)
    assert got == {n: len(s) for n, s in want.items()}
    assert len(hashes) > 1000 and len(got) >= 5 and len(set(got.values())) >= 3  # several chunks; counts that differ


def test_postings_follow_every_write_and_the_migration(scale_library, family_images, hf_image, workdir, tmp_path):
    """Candidate selection's postings (schema 6) after removals, a replacement and adds are what the stored rows
    make, and a schema-5 library (no postings) gets them when opened; on each, `sharing` of a transformers query
    equals the count of its rows, and `zen attribute` of the fork finds its own entry, with those counts."""
    lib_path = tmp_path / "writes.sqlite"
    shutil.copy(scale_library, lib_path)
    mr, pr, ur = _loaded("lora", FORKS["lora"], family_images, hf_image, workdir)
    hashes = {c.listing_sha256 for c in pr.codes}
    with Library(lib_path, invariants=packed) as lib:
        names = sorted(r["name"] for r in lib.list())
        for name in names[::4]:
            lib.remove(name)
        rng = random.Random("postings")
        lib.add("hf~1", ModelMR.from_json(perturb_mr(mr.to_json(), rng)),
                ProgrammaticRepresentation.from_json(perturb_pr(pr.to_json(), rng)), ur, replace=True)  # fmt: skip
        lib.add("lora-self", mr, pr, ur)
        assert posting_problems(lib) == []
        got = lib.sharing("listing", hashes)
        ids = dict(lib.query("SELECT id, name FROM models").fetchall())
        assert got == {ids[m]: n for m, n in postings.counts_by_rows(lib, "listing", hashes).items()}
        assert got["lora-self"] == len(hashes) and len(set(got.values())) >= 3
        lib.query("DROP TABLE listing_postings")
        lib.query("UPDATE meta SET value='5' WHERE key='schema_version'")
    with Library(lib_path, invariants=packed) as lib:
        assert lib.schema_version() == 6 and posting_problems(lib) == [] and lib.sharing("listing", hashes) == got
    fork = case_of("lora", FORKS["lora"], family_images, hf_image, workdir)
    att = json.loads(zen("attribute", fork, "--library", lib_path, "--json").stdout)
    assert att["attributed"] == "lora-self"
    assert all(c["shared_code_objects"] == got[c["name"]] for c in att["candidates"] if c["method"] == "algorithm-1")


def test_a_damaged_posting_is_a_clear_error(scale_library, family_images, hf_image, workdir, tmp_path):
    """A posting that is not a whole number of ids, repeats an id or holds more ids than the library has entries (a
    damaged or forged library file; the long one is never read into memory): `zen attribute` says which
    index is damaged and what to do, exit 2 (a corrupt file), no traceback; the library's other commands still work."""
    lib_path = tmp_path / "damaged.sqlite"
    shutil.copy(scale_library, lib_path)
    _, pr, _ = _loaded("lora", FORKS["lora"], family_images, hf_image, workdir)
    hashes = {c.listing_sha256 for c in pr.codes}
    with Library(lib_path) as lib:
        (h, good), n = lib.query("SELECT hash, models FROM listing_postings WHERE hash = ?", (pr.codes[0].listing_sha256,)
                                 ).fetchone(), len(lib)  # fmt: skip
        forged = {"not a whole number of ids": b"\x01\x02\x03\x04\x05", "repeated ids": bytes(good)[:4] * 2,
                  "longer than the library's entries": np.arange(1, n + 2, dtype="<u4").tobytes()}  # fmt: skip
        for what, blob in forged.items():
            lib.query("UPDATE listing_postings SET models = ? WHERE hash = ?", (blob, h))
            with pytest.raises(LibraryError, match="index of shared code is damaged") as exc:
                lib.sharing("listing", hashes)
            assert ("strictly increasing" if what == "repeated ids" else "not a whole number") in str(exc.value), what
    fork = case_of("lora", FORKS["lora"], family_images, hf_image, workdir)
    r = zen("attribute", fork, "--library", lib_path, "--json", check=False)
    assert r.returncode == 2 and "index of shared code is damaged" in r.stderr and "Traceback" not in r.stderr
    assert "restore the library from a backup" in r.stderr
    assert json.loads(zen("library", "list", "--library", lib_path, "--json").stdout)


def _pairs(att) -> list:
    """Every full comparison's matching, record by record (what `_raw` does not show)."""
    return [(c.name, [(p.recovered.address, p.base.address, p.score, p.attr, p.ibss, p.exact, p.weight) for p in c.match.pairs],
             [r.address for r in c.match.added], [r.address for r in c.match.unmatched_base], c.match.optimal_cos)
            for c in att.candidates if c.match is not None]  # fmt: skip


def _watched_forks(monkeypatch) -> list:
    """Force the parallel path (also on one core) and record how each child's part was obtained."""
    import zen.attribute.parallel_compare as pc
    from zen.runtime.forking import Forked

    seen = []

    class Watched(Forked):
        def result(self):
            try:
                return super().result()
            finally:
                seen.append(self.how)

    monkeypatch.setattr(pc, "Forked", Watched)
    monkeypatch.setattr(pc, "enabled", lambda: True)
    monkeypatch.setattr(pc, "MIN_WORK", 0)  # also for the small models' queries
    return seen


def _split_path(monkeypatch) -> None:
    """The comparisons split beforehand, the child's entries read decoded (entries an older zen stored)."""
    import zen.attribute.algorithm as alg

    monkeypatch.setattr(alg, "_detached", lambda library, names: None)


@pytest.mark.parametrize("fork,path", [("lora", "shared"), ("convnet_se", "shared"), ("gptmini_lora", "shared"),
                                       ("lora", "split")])  # fmt: skip
def test_parallel_comparisons_equal_one_process(scale_library, family_images, hf_image, workdir, fork, path, monkeypatch):
    """Part of the full comparisons in a forked child (`zen attribute`): the same candidates, scores,
    explanation and every matched pair as in one process, and the child did deliver its part; both
    with the queue the two processes share and with the split made beforehand."""
    import gc

    mr, pr, _ = _loaded(fork, FORKS[fork], family_images, hf_image, workdir)
    with Library(scale_library, invariants=packed) as lib:
        one = attribute(mr, pr, lib)
        seen = _watched_forks(monkeypatch)
        if path == "split":
            _split_path(monkeypatch)
        two = attribute(mr, pr, lib, parallel=True)
    # the child's comparisons arrive as arrays; reported by their counts and means before any pair is made from them
    sent = [c.match for c in two.candidates if isinstance(c.match, SentMatch)]
    unmade = [m for m in sent if m._made is None]
    assert sent or fork != "lora"  # a transformers query's comparisons (~0.1 s each) always leave the child some
    assert [m.summary() for m in unmade] == [MatchResult(m.pairs, m.added, m.unmatched_base).summary() for m in unmade]
    _same(two, one)
    assert _pairs(two) == _pairs(one) and sum(c.method == "algorithm-1" for c in two.candidates) >= 3
    assert seen == ["child"] and gc.isenabled()


@pytest.mark.parametrize("path", ["shared", "split"])
def test_parallel_child_without_bodies_falls_back(scale_library, family_images, hf_image, workdir, monkeypatch, path):
    """The child never reads the library: a body not read before the fork fails the child, and this
    process computes the child's part itself (same answer; the collector left on here). With the shared
    queue, this process's own entries read what the prefetch lacked from the library."""
    import gc

    import zen.attribute.parallel_compare as pc

    mr, pr, _ = _loaded("lora", FORKS["lora"], family_images, hf_image, workdir)
    with Library(scale_library, invariants=packed) as lib:
        one = attribute(mr, pr, lib)
        seen = _watched_forks(monkeypatch)
        if path == "split":
            _split_path(monkeypatch)
            monkeypatch.setattr(pc, "_bodies_read", lambda delta, gamma: [])
        else:
            monkeypatch.setattr(Library, "entry_bodies", lambda self, names: {})
        two = attribute(mr, pr, lib, parallel=True)
    _same(two, one)
    assert _pairs(two) == _pairs(one)
    assert seen == ["in-process"] and gc.isenabled()


def test_parallel_only_where_the_work_pays(scale_library, family_images, hf_image, workdir, monkeypatch):
    """A transformers query forks; a ConvNet query, whose candidates hold its code identically, does
    not (the fork and the optimal assignment's import would cost more than its comparisons)."""
    import zen.attribute.parallel_compare as pc

    shipped = pc.MIN_WORK
    seen = _watched_forks(monkeypatch)
    monkeypatch.setattr(pc, "MIN_WORK", shipped)  # _watched_forks lowers it
    with Library(scale_library, invariants=packed) as lib:
        for fork in ("convnet_se", "lora"):
            mr, pr, _ = _loaded(fork, FORKS[fork], family_images, hf_image, workdir)
            attribute(mr, pr, lib, parallel=True)
            seen.append(f"after {fork}")
    assert seen == ["after convnet_se", "child", "after lora"]


def test_early_selection_is_used_only_for_the_checked_code(scale_library, family_images, hf_image, workdir, tmp_path):
    """`zen attribute` selects candidates in a thread from pr.json's bytes while the case is checked:
    the counts equal `Library.sharing` of the checked PR's hashes, and they are used only for exactly
    those hashes (a guess from other bytes is dropped, and attribution runs the query itself)."""
    from zen.attribute.early_selection import EarlySharing

    c = case_of("lora", FORKS["lora"], family_images, hf_image, workdir)
    mr, pr = case.load_mr(c), case.load_pr(c)
    keys = {x.listing_sha256 for x in pr.codes}
    with Library(scale_library, invariants=packed, any_thread=True) as lib:
        with lib.snapshot():
            early = EarlySharing(lib, c / "pr.json")
            assert early.result(keys) == lib.sharing("listing", keys) and early.error is None
            assert early.result(keys - {min(keys)}) is None
            _same(attribute(mr, pr, lib, early=early), attribute(mr, pr, lib))
        odd = tmp_path / "pr.json"
        odd.write_bytes((c / "pr.json").read_bytes().replace(min(keys).encode(), b"0" * 64))
        early = EarlySharing(lib, odd)
        assert early.result(keys) is None and early.keys is not None and early.keys != keys
        assert EarlySharing(lib, tmp_path / "missing.json").result(keys) is None


def test_early_selection_keys_equal_the_pattern(family_images, hf_image, workdir):
    """The listing hashes taken from pr.json's bytes by offset (compiled search) are the pattern's, on a real
    pr.json and on hand-made variants the offsets alone would misread (spaces, upper-case digits, a key cut
    off at the end, a second key inside a string)."""
    from zen.attribute.early_selection import _by_pattern, listing_keys

    data = (case_of("lora", FORKS["lora"], family_images, hf_image, workdir) / "pr.json").read_bytes()
    key = data.index(b'"listing_sha256":"') + len(b'"listing_sha256":"')
    variants = [data, data.replace(b'"listing_sha256":"', b'"listing_sha256": "', 1),
                data[:key] + data[key : key + 64].upper() + data[key + 64 :], data[: key + 30],
                data[:key] + b'\\"listing_sha256\\":\\"' + data[key:], b"", b'"listing_sha256":']  # fmt: skip
    for v in variants:
        assert listing_keys(v) == _by_pattern(v)
    assert len(listing_keys(data)) > 100


def test_early_selection_never_waits_on_a_planted_file(scale_library, tmp_path):
    """pr.json is read before the case is checked: a FIFO (an ordinary open would block until a writer
    came) or a directory in its place leaves the thread at once with no guess."""
    import os

    from zen.attribute.early_selection import EarlySharing

    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    with Library(scale_library, invariants=packed, any_thread=True) as lib:
        for name in ("fifo.json", "dir.json"):
            early = EarlySharing(lib, tmp_path / name)
            early._thread.join(10)
            assert not early._thread.is_alive() and early.value is None and early.keys is None


@pytest.mark.parametrize("path", ["shared", "split"])
def test_parallel_prefetch_failure_falls_back_to_one_process(scale_library, family_images, hf_image, workdir, monkeypatch,
                                                             path):  # fmt: skip
    """Reading the child's bodies before the fork fails (a damaged library, whose missing body matching
    might never read): no child, and the answer one process gives."""
    import zen.attribute.parallel_compare as pc

    mr, pr, _ = _loaded("lora", FORKS["lora"], family_images, hf_image, workdir)
    with Library(scale_library, invariants=packed) as lib:
        one = attribute(mr, pr, lib)
        seen = _watched_forks(monkeypatch)

        def missing(*args):
            raise KeyError("a body the library lost")

        if path == "split":
            _split_path(monkeypatch)
            monkeypatch.setattr(pc, "load_bodies", missing)
        else:
            monkeypatch.setattr(Library, "entry_bodies", missing)
        two = attribute(mr, pr, lib, parallel=True)
    _same(two, one)
    assert seen == []
