"""The data_prep command lines: a missing input, a bad flag or a malformed input is one line
``error: ...`` on stderr and exit status 2, without a traceback.

Each command line runs once as a process of its own (its smoke test: a missing input, or for
synthetic_world a bad flag); the malformed dump runs in this process."""

import bz2
import os

import pytest

from realm_tf.retrieval.publication import testing

import helpers


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return testing.write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"))


def _check_one_line_error(proc, *needles):
  assert proc.returncode == 2, proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr
  last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
  assert last.startswith("error: "), proc.stderr
  for needle in needles:
    assert needle in last, proc.stderr


# (module, the flag naming the missing input, the other flags); {missing}, {vocab} and {out}
# are filled in by the test.
MISSING_INPUT = [
    ("blocks", "--input={missing}", ["--vocab_file={vocab}", "--output_dir={out}"]),
    ("salient_spans", "--blocks_dir={missing}", ["--output_dir={out}"]),
    ("pretrain_examples", "--sentences_dir={missing}",
     ["--vocab_file={vocab}", "--output_dir={out}"]),
    ("ict_examples", "--blocks_dir={missing}", ["--vocab_file={vocab}", "--output_dir={out}"]),
    ("open_qa", "--nq_dev={missing}", ["--output_dir={out}"]),
    ("pipeline", "--corpus={missing}", ["--vocab_file={vocab}", "--output_dir={out}"]),
]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, vocab):
  """Every command line's smoke run (processes of their own, two at a time):
  ``{name: (its paths, the finished process)}``."""
  runs, paths = {}, {}
  for module, input_flag, flags in MISSING_INPUT:
    root = tmp_path_factory.mktemp(module)
    values = {"missing": str(root / "missing.jsonl"), "vocab": vocab, "out": str(root / "out")}
    paths[module] = values
    runs[module] = (f"data_prep.{module}", input_flag.format(**values),
                    *[f.format(**values) for f in flags])
  paths["synthetic_world"] = {"out": str(tmp_path_factory.mktemp("synthetic_world") / "world")}
  runs["synthetic_world"] = ("data_prep.synthetic_world",
                             f"--output_dir={paths['synthetic_world']['out']}",
                             "--num_people=many")
  done = helpers.run_processes(runs)
  return {name: (paths[name], done[name]) for name in runs}


@pytest.mark.parametrize("module", [case[0] for case in MISSING_INPUT])
def test_missing_input_is_one_line(smoke, module):
  values, proc = smoke[module]
  _check_one_line_error(proc, values["missing"])
  assert not os.path.exists(values["out"])


def test_bad_flag_value_is_one_line(smoke):
  values, proc = smoke["synthetic_world"]
  _check_one_line_error(proc, "--num_people", "many")
  assert not os.path.exists(values["out"])


def test_malformed_input_is_one_line(tmp_path, vocab):
  """A malformed dump fails inside a Beam step: still one line, without Beam's traceback."""
  dump = tmp_path / "broken.xml.bz2"
  dump.write_bytes(bz2.compress(b"<mediawiki><page><title>A</title><ns>0</ns></page><page>"))
  proc = helpers.run_cli("data_prep.blocks", f"--input={dump}", f"--vocab_file={vocab}",
                         f"--output_dir={tmp_path / 'out'}")
  _check_one_line_error(proc, "malformed MediaWiki XML", str(dump))
  assert not os.path.exists(tmp_path / "out")
