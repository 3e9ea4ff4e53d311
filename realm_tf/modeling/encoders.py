"""Builds Model Garden's ``BertEncoderV2`` from a ``BertEncoderConfig``."""

import tensorflow as tf
import tf_keras
from official.modeling import tf_utils
from official.nlp.configs import encoders
from official.nlp.modeling import networks


# ``BertEncoderConfig.hidden_activation`` names of the two GELUs. Google's BERT (and so every
# released TF1 checkpoint) calls the tanh approximation "gelu"; Hugging Face's "gelu" is the exact
# erf form, which is ``GELU_EXACT`` here.
GELU_TANH = "gelu"
GELU_EXACT = "gelu_exact"


@tf_keras.utils.register_keras_serializable(package="realm_tf")
def gelu_exact(x):
  """The exact GELU, ``x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))``.

  Registered as ``realm_tf>gelu_exact``, so an encoder built with it survives ``get_config`` /
  ``from_config``.
  """
  return tf_keras.activations.gelu(x, approximate=False)


def get_activation(name: str):
  """Activation by name.

  ``gelu`` is BERT's tanh approximation, as in the released models; ``gelu_exact`` is the erf
  form (Hugging Face's ``gelu``). Other names go to Model Garden's ``tf_utils.get_activation``.
  """
  if name == GELU_TANH:
    return tf_utils.get_activation("gelu", approximate=True)
  if name == GELU_EXACT:
    return gelu_exact
  return tf_utils.get_activation(name)


def build_bert_encoder(config: encoders.BertEncoderConfig,
                       name: str = "bert") -> networks.BertEncoderV2:
  """A built ``BertEncoderV2`` for ``config`` (``sequence_output``, ``pooled_output``)."""
  network = networks.BertEncoderV2(
      vocab_size=config.vocab_size,
      hidden_size=config.hidden_size,
      num_layers=config.num_layers,
      num_attention_heads=config.num_attention_heads,
      max_sequence_length=config.max_position_embeddings,
      type_vocab_size=config.type_vocab_size,
      inner_dim=config.intermediate_size,
      inner_activation=get_activation(config.hidden_activation),
      output_dropout=config.dropout_rate,
      attention_dropout=config.attention_dropout_rate,
      initializer=tf_keras.initializers.TruncatedNormal(stddev=config.initializer_range),
      embedding_width=config.embedding_size,
      norm_first=config.norm_first,
      name=name)
  return ensure_built(network)


def ensure_built(network):
  """Creates the encoder's variables with one dummy call, so heads can tie to its embeddings."""
  dummy = tf.ones([1, 2], tf.int32)
  network(dict(input_word_ids=dummy, input_mask=dummy, input_type_ids=dummy * 0))
  return network


class NetworkConfigMixin:
  """``get_config``/``from_config`` for models built around ``self.encoder`` (a BERT network)
  plus the plain keyword arguments kept in ``self._config``."""

  def get_config(self):
    return dict(network=tf_keras.layers.serialize(self.encoder), **self._config)

  @classmethod
  def from_config(cls, config, custom_objects=None):
    config = dict(config)
    config["network"] = ensure_built(tf_keras.layers.deserialize(
        config["network"], custom_objects=custom_objects))
    return cls(**config)
