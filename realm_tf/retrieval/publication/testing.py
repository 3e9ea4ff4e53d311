"""Tiny model directories and corpora for the retrieval tests, benchmarks and demos."""

import functools
import os
import re
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf import modeling
from realm_tf import tokenization
from realm_tf.data import manifests

WORDS = ("the a of and in to is was by for on as with from at river city king war music "
         "paris france london river mountain science physics album band film actor born "
         "capital island ocean history empire language painter novel poem church railway "
         "station team football player season election party president museum bridge").split()


@functools.lru_cache(maxsize=None)
def two_cpu_strategy() -> tf.distribute.MirroredStrategy:
  """One ``MirroredStrategy`` over the logical ``/cpu:0`` and ``/cpu:1`` (tests/conftest.py
  splits the CPU) for a whole process: two strategies over the same devices would reuse the
  same collective keys, and an all-gather of one type then meets another's all-reduce."""
  return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def write_vocab(path: str, texts: Sequence[str] = ()) -> str:
  """A small WordPiece vocabulary: special tokens, letters, ``##`` letters, words of ``texts``."""
  words = sorted(set(WORDS) | {w for t in texts for w in re.findall(r"[a-z]+", t.lower())})
  letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
  vocab = (list(tokenization.RESERVED_TOKENS) + list("0123456789.,?!'-") + letters
           + ["##" + c for c in letters] + [w for w in words if len(w) > 1])
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(vocab) + "\n")
  return path


def random_texts(n: int, seed: int = 0, min_words: int = 4,
                 max_words: int = 30) -> Tuple[List[str], List[str]]:
  """``n`` (title, body) pairs of random words."""
  rng = np.random.default_rng(seed)
  titles, bodies = [], []
  for i in range(n):
    titles.append(" ".join(rng.choice(WORDS, 2)) + f" {i}")
    bodies.append(" ".join(rng.choice(WORDS, int(rng.integers(min_words, max_words)))))
  return titles, bodies


def tiny_model_config(vocab_file: str, hidden_size: int = 16, projection_size: int = 16,
                      share_embedders: bool = True, query_seq_length: int = 16,
                      block_seq_length: int = 32) -> configs.RealmModelConfig:
  vocab_size = len(tokenization.load_vocab(vocab_file))
  return configs.RealmModelConfig(
      retriever=configs.RetrieverConfig(
          encoder=configs.bert_tiny(vocab_size, hidden_size), projection_size=projection_size,
          share_embedders=share_embedders, query_seq_length=query_seq_length,
          block_seq_length=block_seq_length),
      reader=configs.ReaderConfig(encoder=configs.bert_tiny(vocab_size, hidden_size),
                                  seq_length=query_seq_length + block_seq_length),
      vocab_file=vocab_file)


class TinyTrainer:
  """Writes checkpoints of perturbed towers into a model directory, as a trainer would: the
  towers of ``config``, or of ``tiny_model_config(vocab_file, **config_kwargs)``.

  Example::

    trainer = TinyTrainer(model_dir, vocab_file)
    trainer.save(100)             # ckpt-100
    trainer.perturb(); trainer.save(200)
    trainer.finish(200)           # TRAINING_DONE
  """

  def __init__(self, model_dir: str, vocab_file: str, max_to_keep: int = 3, seed: int = 0,
               config: Optional[configs.RealmModelConfig] = None, **config_kwargs):
    self.model_dir = model_dir
    self.config = config or tiny_model_config(vocab_file, **config_kwargs)
    model_dir_lib.write_metadata(model_dir, self.config, vocab_file)
    self.config = model_dir_lib.load_config(model_dir)
    tf_keras.utils.set_random_seed(seed)
    self.query_embedder, self.block_embedder = modeling.build_embedders(self.config.retriever)
    self._rng = np.random.default_rng(seed)
    self._manager = tf.train.CheckpointManager(
        model_dir_lib.make_checkpoint(query_embedder=self.query_embedder,
                                      block_embedder=self.block_embedder),
        model_dir, max_to_keep=max_to_keep, checkpoint_name="ckpt")

  def perturb(self, scale: float = 0.05) -> None:
    towers = {id(self.query_embedder): self.query_embedder,
              id(self.block_embedder): self.block_embedder}
    for tower in towers.values():
      for v in tower.trainable_variables:
        v.assign_add(self._rng.normal(0, scale, v.shape).astype(np.float32))

  def save(self, step: int) -> str:
    return self._manager.save(checkpoint_number=step)

  def finish(self, step: Optional[int] = None) -> None:
    model_dir_lib.mark_training_done(self.model_dir, step)


def make_corpus(blocks_dir: str, vocab_file: str, num_blocks: int, block_seq_length: int = 32,
                num_shards: int = 2, seed: int = 0, min_words: int = 4,
                max_words: int = 30) -> dict:
  """A blocks directory of ``num_blocks`` random blocks; returns its manifest."""
  titles, bodies = random_texts(num_blocks, seed, min_words, max_words)
  tokenizer = tokenization.RealmTokenizer(vocab_file)
  return manifests.write_blocks(blocks_dir, titles, bodies, tokenizer, block_seq_length,
                                num_shards=num_shards)


def make_openqa_model(model_dir: str, vocab_file: str, openqa_seq_length: int = 64,
                      seed: int = 0, initializer_range: float = 1.0,
                      **config_kwargs) -> configs.RealmModelConfig:
  """A random-init Open-QA model directory (shared towers, a reader with a span scorer),
  ``ckpt-1``: what ``realm-answer`` and ``realm-serve`` load, for plumbing tests.

  The towers are initialized with a wide ``initializer_range`` (BERT's is 0.02): at BERT's
  scale a random tower embeds every text almost alike (retrieval scores within 1e-5 of each
  other), so the beam and the best span would hang on rounding, which differs between
  batch sizes and machines; at 1.0 they are separated by far more than rounding."""
  config = tiny_model_config(vocab_file, **config_kwargs)
  config.override({"reader": {"openqa_seq_length": openqa_seq_length, "span_hidden_size": 8,
                              "encoder": {"initializer_range": initializer_range}},
                   "retriever": {"encoder": {"initializer_range": initializer_range}}})
  model_dir_lib.write_metadata(model_dir, config, vocab_file)
  tf_keras.utils.set_random_seed(seed)
  embedder, _ = modeling.build_embedders(config.retriever)
  reader = modeling.build_reader(config.reader, with_span_scorer=True)
  model_dir_lib.make_checkpoint(query_embedder=embedder, block_embedder=embedder,
                                reader=reader).save(os.path.join(model_dir, "ckpt"))
  return config
