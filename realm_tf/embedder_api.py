"""A small user API: load a retriever and embed queries and blocks as NumPy arrays."""

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf.tokenization import RealmTokenizer


class Embedder:
  """REALM's query and block towers with their tokenizer.

  Example::

    embedder = realm_tf.Embedder.load("converted/cc_news_embedder")
    q = embedder.embed_queries(["who wrote hamlet?"])              # [1, 128]
    b = embedder.embed_blocks(["Hamlet"], ["Hamlet is a tragedy by William Shakespeare."])
    scores = q @ b.T                                               # REALM's f(x, z)
  """

  def __init__(self, config, query_embedder, block_embedder, tokenizer: RealmTokenizer,
               step: Optional[int] = None):
    self.config = config
    self.query_embedder = query_embedder
    self.block_embedder = block_embedder
    self.tokenizer = tokenizer
    self.step = step
    self._embed_q = modeling.inference_function(query_embedder)
    self._embed_b = modeling.inference_function(block_embedder)

  @classmethod
  def load(cls, path: str, checkpoint: Optional[str] = None) -> "Embedder":
    """Loads a model directory (``realm-convert`` output or a trainer's ``model_dir``).

    Args:
      path: the model directory.
      checkpoint: a specific ``ckpt-N`` in it; by default the newest.
    """
    config = model_dir_lib.load_config(path)
    tokenizer = RealmTokenizer(config.vocab_file, lower_case=config.lower_case)
    query_embedder, block_embedder = modeling.build_embedders(config.retriever)
    checkpoint = checkpoint or model_dir_lib.latest_checkpoint(path)
    model_dir_lib.restore(checkpoint, query_embedder=query_embedder)
    if not config.retriever.share_embedders:
      names = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
      if any(n.startswith("block_embedder/") for n in names):
        model_dir_lib.restore(checkpoint, block_embedder=block_embedder)
      else:  # ORQA checkpoints ship precomputed block embeddings, not a block tower.
        block_embedder = None
    return cls(config, query_embedder, block_embedder, tokenizer,
               step=model_dir_lib.checkpoint_step(checkpoint))

  def _run(self, fn, make_inputs, n, batch_size):
    out = [np.zeros([0, self.config.retriever.projection_size], np.float32)]
    for start in range(0, n, batch_size):
      out.append(fn(make_inputs(start, min(n, start + batch_size))).numpy())
    return np.concatenate(out, axis=0)

  def embed_queries(self, queries: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """``[CLS] query [SEP]`` embeddings, float32 ``[n, projection_size]``."""
    length = self.config.retriever.query_seq_length
    return self._run(self._embed_q,
                     lambda a, b: self.tokenizer.query_inputs(list(queries[a:b]), length),
                     len(queries), batch_size)

  def embed_blocks(self, titles: Sequence[str], bodies: Sequence[str],
                   batch_size: int = 64) -> np.ndarray:
    """``[CLS] title [SEP] body [SEP]`` embeddings, float32 ``[n, projection_size]``."""
    if self.block_embedder is None:
      raise ValueError("this checkpoint has no block tower (ORQA models ship block "
                       "embeddings instead: block_emb.npy)")
    if len(titles) != len(bodies):
      raise ValueError(f"{len(titles)} titles but {len(bodies)} bodies")
    length = self.config.retriever.block_seq_length
    return self._run(
        self._embed_b,
        lambda a, b: self.tokenizer.block_inputs(list(titles[a:b]), list(bodies[a:b]), length),
        len(titles), batch_size)
