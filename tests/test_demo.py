"""The README's second command: the demo runs end to end and checks itself against the process."""

from __future__ import annotations

from conftest import zen


def test_demo_runs(tmp_path):
    res = zen("demo", "--dir", tmp_path / "demo")
    assert "OK: demo finished" in res.stdout
    assert "module classes match: True" in res.stdout
    assert "tensors bit-exact: 21/21" in res.stdout  # every recovered tensor hashes like the process's own
    assert (tmp_path / "demo" / "case" / "weights.safetensors").exists()
    assert "channel_shuffle" in res.stdout  # the model's helper function was rebuilt from the image
    assert not (tmp_path / "demo" / "deployed.core").exists()  # images are not left behind
