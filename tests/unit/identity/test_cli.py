"""`sapo keys` without a broker: key pairs, showing keys, building a trust list. (Announcing to the
keys topic is exercised against the real broker in tests/integration/test_identity.py.)"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sapo.cli import main
from sapo.identity.keys import read_private
from sapo.identity.trustlist import load_trust_list

pytestmark = pytest.mark.unit


def _out(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())


def test_generate_show_and_trust(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key_path = tmp_path / "node-0.key"
    assert main(["keys", "generate", str(key_path)]) == 0
    generated = _out(capsys)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert generated["key_id"] == read_private(key_path).key_id
    assert generated["public_key_file"] == f"{key_path}.pub"

    for source in (str(key_path), f"{key_path}.pub", generated["public_key"]):
        assert main(["keys", "show", source]) == 0
        assert _out(capsys) == {"key_id": generated["key_id"], "public_key": generated["public_key"]}

    trust = tmp_path / "trust.yaml"
    assert main(["keys", "trust", str(trust), "--node", "node-0", "--key", f"{key_path}.pub"]) == 0
    assert _out(capsys)["nodes"] == "1"
    admin = tmp_path / "admin.key"
    assert main(["keys", "generate", str(admin)]) == 0
    capsys.readouterr()
    assert main(["keys", "trust", str(trust), "--admin", str(admin)]) == 0
    listed = load_trust_list(trust)
    assert listed.nodes == {"node-0": (generated["public_key"],)}
    assert listed.admins == (read_private(admin).public_text,)

    assert main(["keys", "trust", str(trust), "--remove", generated["key_id"], "--revoke"]) == 0
    assert load_trust_list(trust).revoked == (generated["key_id"],)


def test_refusals_exit_1_and_leave_files_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key_path = tmp_path / "k.key"
    assert main(["keys", "generate", str(key_path)]) == 0
    before = key_path.read_bytes()
    assert main(["keys", "generate", str(key_path)]) == 1
    assert key_path.read_bytes() == before
    trust = tmp_path / "trust.yaml"
    assert main(["keys", "trust", str(trust), "--node", "node-0", "--key", str(key_path)]) == 0
    listed = trust.read_text()
    assert main(["keys", "trust", str(trust), "--node", "node-1", "--key", str(key_path)]) == 1
    assert main(["keys", "trust", str(trust), "--node", "node-1"]) == 1
    assert main(["keys", "show", str(tmp_path / "missing")]) == 1
    assert main(["keys", "trust", str(trust), "--remove", "0" * 32]) == 1  # a key id nobody has
    assert trust.read_text() == listed
    public = key_path.with_name("k.key.pub").read_bytes()
    key_path.rename(tmp_path / "k.key.bak")  # the public half of that key stays: not replaced
    assert main(["keys", "generate", str(key_path)]) == 1
    assert key_path.with_name("k.key.pub").read_bytes() == public and not key_path.exists()
    assert main(["keys", "generate", str(tmp_path / "no-such-folder" / "k.key")]) == 1


def test_bad_durations_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """A negative wait was taken as forever by the Kafka client: `sapo topics --timeout -5` hung."""
    for command in (
        ["topics", "--bootstrap", "127.0.0.1:1", "--node", "n0", "--timeout", "-5"],
        [
            "keys",
            "revoke",
            "--bootstrap",
            "127.0.0.1:1",
            "--node",
            "n0",
            "--key-id",
            "0" * 32,
            "--timeout",
            "nan",
        ],
        ["inspect", "--bootstrap", "127.0.0.1:1", "swarm", "--idle", "0"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(command)
        assert exc.value.code == 2
        assert "must be a number of seconds > 0" in capsys.readouterr().err


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["keys", "trust", "t.yaml", "--remove", "not-a-key-id"])
    assert exc.value.code == 2
    assert "not a key id" in capsys.readouterr().err


def test_admission_by_public_key_needs_an_admin(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key_path = tmp_path / "node-9.key"
    assert main(["keys", "generate", str(key_path)]) == 0
    announce = ["keys", "announce", "--bootstrap", "127.0.0.1:1", "--node", "node-9"]
    assert main([*announce, "--public-key", f"{key_path}.pub"]) == 1  # refused before any broker is asked
    assert "needs --admin-key" in caplog.text


@pytest.mark.parametrize("path", ["", "/"])
def test_a_key_path_that_names_no_file_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], path: str
) -> None:
    """`keys generate ''` ended in a ValueError traceback (the public half's name is built from it)."""
    with pytest.raises(SystemExit) as exc:
        main(["keys", "generate", path])
    assert exc.value.code == 2
    assert f"argument path: {path!r} names no file" in capsys.readouterr().err


@pytest.mark.parametrize("overlap", ["nan", "inf", "1e300", "4e9"])
def test_an_overlap_no_timestamp_holds_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], overlap: str
) -> None:
    """inf and 1e300 ended in an OverflowError traceback, 4e9 in a protobuf ValueError, and nan was
    published as no overlap at all."""
    announce = ["keys", "announce", "--bootstrap", "127.0.0.1:1", "--node", "node-0", "--key", "k"]
    with pytest.raises(SystemExit) as exc:
        main([*announce, "--previous", "old", "--overlap", overlap])
    assert exc.value.code == 2
    assert (
        f"argument --overlap: must be a number of seconds <= 3153600000, got {overlap}"
        in capsys.readouterr().err
    )
