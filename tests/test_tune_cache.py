"""The on-disk autotune cache (cpp/src/core/tune_cache.hpp, RUDNN_AUTOTUNE_CACHE): what one
process records, others read; torn or foreign lines are skipped; later lines win; unset, nothing
is read or written; an unwritable file costs a warning, not the call. The attention autotune's
use of it runs on a GPU (test_attention.py)."""

import os
import subprocess
import sys

import pytest

import rudnn
from rudnn import _C


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "autotune.tsv"
    monkeypatch.setenv("RUDNN_AUTOTUNE_CACHE", str(path))
    return path


def _lookup_in_new_process(path, key):
    code = f"from rudnn import _C; print(repr(_C._tune_cache_lookup({key!r})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "RUDNN_AUTOTUNE_CACHE": str(path)})
    return eval(result.stdout)


def test_a_recorded_choice_is_read_by_another_process(cache_file):
    assert _C._tune_cache_lookup("attention forward | shape class 1") == ""
    _C._tune_cache_store("attention forward | shape class 1", "flash_sm90")
    assert _C._tune_cache_lookup("attention forward | shape class 1") == "flash_sm90"
    assert cache_file.read_text() == "attention forward | shape class 1\tflash_sm90\n"
    assert _lookup_in_new_process(cache_file, "attention forward | shape class 1") == "flash_sm90"
    assert _lookup_in_new_process(cache_file, "attention forward | shape class 2") == ""


def test_later_lines_win_and_bad_lines_are_skipped(cache_file):
    cache_file.write_text("k1\tfallback\n"
                          "a line without a tab\n"
                          "k2\tflash_sm80\textra\n"    # two tabs: not key<TAB>choice
                          "\tno key\n"
                          "k3\t\n"                     # no choice
                          "k1\tflash_sm80\n"
                          "k4\tflash_sm9")            # torn: another process was still writing
    assert _lookup_in_new_process(cache_file, "k1") == "flash_sm80"
    for key in ("k2", "k3", "", "a line without a tab"):
        assert _lookup_in_new_process(cache_file, key) == ""
    assert _lookup_in_new_process(cache_file, "k4") == "flash_sm9"  # a name the op then refuses
    _C._tune_cache_store("k5", "fallback")  # starts a line of its own after the torn one
    assert cache_file.read_text().endswith("k4\tflash_sm9\nk5\tfallback\n")
    assert _lookup_in_new_process(cache_file, "k5") == "fallback"


def test_unset_reads_and_writes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "autotune.tsv"
    monkeypatch.setenv("RUDNN_AUTOTUNE_CACHE", str(path))
    _C._tune_cache_store("k", "fallback")
    monkeypatch.delenv("RUDNN_AUTOTUNE_CACHE")
    assert _C._tune_cache_lookup("k") == ""
    _C._tune_cache_store("k2", "fallback")
    assert path.read_text() == "k\tfallback\n"


def test_an_unwritable_file_warns_once(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("RUDNN_AUTOTUNE_CACHE", str(tmp_path / "no such dir" / "autotune.tsv"))
    _C._tune_cache_store("k", "fallback")
    _C._tune_cache_store("k2", "fallback")
    err = capfd.readouterr().err
    assert err.count("cannot be written; autotune choices stay in this process") == 1
    assert _C._tune_cache_lookup("k") == "fallback"  # still kept in this process


def test_build_id_names_version_and_commit():
    version, commit = _C.build_id().split(" ")
    assert version == rudnn.__version__
    assert commit == "unknown" or (len(commit) == 12 and all(c in "0123456789abcdef" for c in commit))
