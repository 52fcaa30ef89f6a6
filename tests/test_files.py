"""Files a user names (issue 38's reproducers): a FIFO or a device as a hardware profile or
a config.json is refused before it is opened (a read would block or never end), JSON
nested past the parser's limit is refused as such, each in one line naming the field."""

from __future__ import annotations

import os

import pytest

from costmodel.catalog.files import read_bytes, read_json
from costmodel.cli import main
from costmodel.specs.checks import SpecError


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    path = tmp_path / "profile.json"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(("flag", "field"), [("--hardware", "hardware"),
                                             ("--hf-config", "hf_config")])  # fmt: skip
def test_a_fifo_is_refused_not_read(capsys, fifo, flag, field):
    argv = ["estimate", flag, str(fifo)] + (["--model", "gpt2"] if flag == "--hardware" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag}: {fifo} is not a regular file" in err and err.count("\n") == 1


def test_a_device_is_refused_not_read(capsys):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert main(["estimate", "--model", "gpt2", "--hardware", "/dev/zero"]) == 2
    assert "hardware: /dev/zero is not a regular file" in capsys.readouterr().err


def test_deeply_nested_json_is_refused_as_such(capsys, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["estimate", "--model", "gpt2", "--hardware", str(path)]) == 2
    err = capsys.readouterr().err
    assert "holds JSON nested too deeply" in err and "Traceback" not in err


def test_a_file_past_the_limit_is_not_read_whole(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b"[" + b" " * 4096 + b"]")
    assert len(read_bytes(path, "hardware", limit=2048)) == 2049  # one past: enough to tell
    with pytest.raises(SpecError, match=r"big\.json is larger than 2,048 bytes"):
        read_json(path, "hardware", limit=2048)
    assert read_json(path, "hardware", limit=8192) == []


def test_a_misspelt_profile_field_is_refused(tmp_path):
    """A probe: allocator_reserv (for allocator_reserve) was ignored, so reserved equalled
    the peak; an unknown field inside efficiency was refused. Both are now."""
    import json

    from costmodel.catalog.hardware import HARDWARE, get_hardware

    path = tmp_path / "typo.json"
    path.write_text(json.dumps({**HARDWARE["h100-sxm"], "allocator_reserv": 1.3}))
    with pytest.raises(SpecError, match=r"unknown field\(s\) allocator_reserv"):
        get_hardware(str(path))
    path.write_text(json.dumps({**HARDWARE["h100-sxm"], "_note": "kept", "provenance": {}}))
    assert get_hardware(str(path)).hbm_bytes == get_hardware("h100-sxm").hbm_bytes
