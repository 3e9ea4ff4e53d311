"""REALM's networks (on Model Garden's Keras BERT), models and losses."""

from realm_tf.modeling.embedder import RealmEmbedder, inference_function
from realm_tf.modeling.encoders import build_bert_encoder
from realm_tf.modeling.factory import build_embedder, build_embedders, build_reader
from realm_tf.modeling.models import (OpenQaModel, ReaderModel, RealmPretrainer,
                                      RetrieverModel)
from realm_tf.modeling.reader import KnowledgeAugmentedEncoder
from realm_tf.modeling.span_scorer import SpanScorer, candidate_spans
