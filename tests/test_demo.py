"""The README's second command: the demo runs end to end and checks itself against the processes."""

from __future__ import annotations

from conftest import zen


def test_demo_runs(tmp_path):
    res = zen("demo", "--dir", tmp_path / "demo")
    out = " ".join(res.stdout.split())  # rich wraps long lines
    assert "OK: demo finished" in out
    assert "module classes match: True" in out
    assert "tensors bit-exact: 21/21" in out  # every recovered tensor hashes like the process's own
    assert "helper code recovered: True" in out and "channel_shuffle" in out
    assert "attributed to tiny-base" in out and "attributed to the base: True" in out
    assert "+ zen.demo.tiny_base:channel_shuffle" in out  # the diff names the fork's new helper
    assert "rebuilt output bit-identical: True" in out  # the patched base reproduced the deployed response
    assert (tmp_path / "demo" / "case" / "weights.safetensors").exists()
    assert (tmp_path / "demo" / "rebuilt_model" / "patch.json").exists()
    report = (tmp_path / "demo" / "report.html").read_text()
    assert "tiny-base" in report and "bit-identical" in report and "channel_shuffle" in report
    assert not (tmp_path / "demo" / "deployed.core").exists()  # images are not left behind
    assert not (tmp_path / "demo" / "base.core").exists()
