"""Text search over a published index: query text -> query tower -> top-k blocks and their text.

Example::

    with TextSearcher(index_dir, model_dir, blocks_dir) as searcher:
      for hit in searcher.search_text(["who wrote hamlet?"], k=5)[0]:
        print(f"{hit.score:.3f} {hit.title}: {hit.body}")

The query tower is the one the index was built with (the index's ``query_embedder`` snapshot),
else the given checkpoint, else the newest checkpoint of the model directory.
"""

from typing import List, NamedTuple, Optional, Sequence

import numpy as np

from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf import tokenization
from realm_tf.data import block_store
from realm_tf.data import corpus_updates
from realm_tf.data import manifests
from realm_tf.retrieval.publication import handle as handle_lib
from realm_tf.retrieval.publication import refresher


class Hit(NamedTuple):
  """One search result: a block, its inner-product score, its title and its text."""
  block_id: int
  score: float
  title: str
  body: str


class TextSearcher:
  """Searches the index ``index_dir/LATEST`` names with query text.

  Args:
    index_dir: where indexes are published.
    model_dir: the model directory (its config and vocabulary; its checkpoints when the index
      has no query tower of its own).
    blocks_dir: the corpus the index was built over (checked by fingerprint).
    checkpoint: the query tower's checkpoint when the index has none (default: the newest).
    wait_seconds: how long to wait for a first index (IndexNotReadyError after that).
  """

  def __init__(self, index_dir: str, model_dir: str, blocks_dir: str,
               checkpoint: Optional[str] = None, wait_seconds: float = 0.0):
    self.blocks_dir = blocks_dir
    self._store = None   # the block store, for the hits' titles and texts (opened when needed)
    self.config = model_dir_lib.load_config(model_dir)
    blocks_manifest = manifests.load_blocks_manifest(blocks_dir)
    self.handle = handle_lib.IndexHandle(index_dir,
                                         expected_fingerprint=corpus_updates.fingerprints(
                                             blocks_manifest),
                                         expected_dim=self.config.retriever.projection_size,
                                         wait_seconds=wait_seconds, watch=False)
    self.handle.wait_for_first()
    self.query_embedder, _ = modeling.build_embedders(self.config.retriever)
    tower = (self.handle.query_embedder_checkpoint
             or refresher.find_checkpoint(model_dir, checkpoint))
    model_dir_lib.restore(tower, query_embedder=self.query_embedder)
    self.tokenizer = tokenization.RealmTokenizer(self.config.vocab_file,
                                                 lower_case=self.config.lower_case)

  def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
    """Query-tower embeddings ``float32 [len(queries), dim]``."""
    inputs = self.tokenizer.query_inputs(list(queries), self.config.retriever.query_seq_length)
    return self.query_embedder(inputs, training=False).numpy()

  def search_text(self, queries: Sequence[str], k: int) -> List[List[Hit]]:
    """The top ``k`` blocks of each query (at most the corpus size), best first."""
    k = min(k, self.handle.index.num_live)
    ids, scores = self.handle.search(self.embed_queries(queries), k)
    if self._store is None:
      self._store = block_store.BlockStore.open(
          self.blocks_dir, fingerprint=self.handle.manifest.get("corpus_fingerprint"))
    store = self._store
    return [[Hit(block_id, score, store.titles[block_id], store.texts[block_id])
             if 0 <= block_id < len(store) else Hit(block_id, score, "?", "")
             for block_id, score in zip(row_ids.tolist(), row_scores.tolist())]
            for row_ids, row_scores in zip(ids, scores)]

  def close(self) -> None:
    self.handle.close()

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.close()
