"""Builds REALM's networks from their configs."""

from typing import Tuple

from realm_tf import configs
from realm_tf.modeling.embedder import RealmEmbedder
from realm_tf.modeling.encoders import build_bert_encoder
from realm_tf.modeling.reader import KnowledgeAugmentedEncoder


def build_embedder(config: configs.RetrieverConfig, name: str = "embedder") -> RealmEmbedder:
  embedder = RealmEmbedder(build_bert_encoder(config.encoder, name=f"{name}_bert"),
                           projection_size=config.projection_size,
                           initializer_range=config.encoder.initializer_range,
                           projection_dropout=config.projection_dropout, name=name)
  return embedder.build_from_length()


def build_embedders(config: configs.RetrieverConfig) -> Tuple[RealmEmbedder, RealmEmbedder]:
  """(query_embedder, block_embedder): the same object when ``share_embedders``."""
  if config.share_embedders:
    embedder = build_embedder(config, "embedder")
    return embedder, embedder
  return build_embedder(config, "query_embedder"), build_embedder(config, "block_embedder")


def build_reader(config: configs.ReaderConfig, with_span_scorer: bool = False,
                 name: str = "reader") -> KnowledgeAugmentedEncoder:
  reader = KnowledgeAugmentedEncoder(
      build_bert_encoder(config.encoder, name=f"{name}_bert"),
      mlm_activation=config.encoder.hidden_activation,
      initializer_range=config.encoder.initializer_range,
      span_hidden_size=config.span_hidden_size if with_span_scorer else None, name=name)
  return reader.build_from_length()
