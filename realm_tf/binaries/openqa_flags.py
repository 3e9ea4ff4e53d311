"""The flags realm-answer, realm-eval and realm-serve share, defined once (as Model Garden's
``official/common/flags.py`` defines its binaries' common ones), and the model they name.

A binary calls the ``define_*`` functions at import time; its ``main`` reads the values and
passes them (``FLAGS.flag_values_dict()``) to :func:`load_openqa`, so that no function here
reads ``FLAGS``.
"""

from typing import Dict, Optional

from absl import app
from absl import flags
import tensorflow as tf

from realm_tf import model_dir as model_dir_lib
from realm_tf.openqa import predict
from realm_tf.retrieval.sparse import hybrid


def define_model_flags(reader_beam_help: str = "Blocks read per question.") -> None:
  """``--model_dir``, ``--index_dir``, ``--checkpoint`` and ``--reader_beam_size``."""
  flags.DEFINE_string("model_dir", None, "A fine-tuned Open-QA model directory (span scorer).")
  flags.DEFINE_string("index_dir", None, "The index the model was fine-tuned against.")
  flags.DEFINE_string("checkpoint", None,
                      "A checkpoint (default: <model_dir>/best_ckpt's, else the newest).")
  flags.DEFINE_integer("reader_beam_size", 5, reader_beam_help, lower_bound=1)


def define_retrieval_flags(retriever_beam_size: Optional[int], retriever_beam_help: str) -> None:
  """``--blocks_dir``, ``--retriever_beam_size`` and ``--retriever``."""
  flags.DEFINE_string("blocks_dir", None, "The index's corpus (default: the one it names).")
  flags.DEFINE_integer("retriever_beam_size", retriever_beam_size, retriever_beam_help,
                       lower_bound=1)
  flags.DEFINE_enum("retriever", hybrid.DEFAULT, hybrid.RETRIEVERS,
                    "The blocks read: the dense index's top, BM25's (the index's sparse part) "
                    "or both fused by the index's rule (realm_tf/retrieval/sparse/hybrid.py).")


def check_model_dir(values: Dict, hint: str = "") -> None:
  """UsageError without ``--model_dir`` or ``--index_dir`` (``hint`` says what else would do),
  ModelDirError when the model directory is not there."""
  missing = [f"--{n}" for n in ("model_dir", "index_dir") if not values.get(n)]
  if missing:
    raise app.UsageError(f"missing flags: {', '.join(missing)}{hint}")
  if not tf.io.gfile.isdir(values["model_dir"]):
    raise model_dir_lib.ModelDirError(f"model directory not found: {values['model_dir']}")


def load_openqa(values: Dict, hint: str = "") -> predict.OpenQA:
  """The Open-QA model the flag ``values`` name (checked first, see :func:`check_model_dir`)."""
  check_model_dir(values, hint)
  return predict.OpenQA.load(values["model_dir"], values["index_dir"], values["blocks_dir"],
                             checkpoint=values["checkpoint"],
                             reader_beam_size=values["reader_beam_size"],
                             retriever_beam_size=values["retriever_beam_size"],
                             retriever=values["retriever"])
