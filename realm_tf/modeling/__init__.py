"""REALM's networks, built from Model Garden's Keras BERT."""

from realm_tf.modeling.embedder import RealmEmbedder
from realm_tf.modeling.encoders import build_bert_encoder
from realm_tf.modeling.factory import build_embedder, build_embedders, build_reader
from realm_tf.modeling.reader import KnowledgeAugmentedEncoder
from realm_tf.modeling.span_scorer import SpanScorer, candidate_spans
