"""Held-out evaluation of a REALM checkpoint on masked sentences.

* zero-shot retrieval recall@k (Table 2 of the paper): does one of the top-k retrieved blocks
  (the sentence's own block excluded) contain the masked answer text?
* mean retrieval utility ``log p(y|x) - log p(y|null,x)`` and marginal MLM accuracy, reading
  the null block and the top ``num_candidates - 1`` blocks.

Retrieval here is exact (brute force over all blocks embedded with the checkpoint's own block
tower), so the numbers measure the checkpoint, not the staleness of an index.
"""

from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.tasks import losses
from realm_tf.tasks import realm_pretrain
from realm_tf.tasks import retrieval_inputs
from realm_tf.tasks.realm_model import RealmPretrainer
from realm_tf.tokenization import RealmTokenizer


def _normalize(text: str) -> str:
  return " ".join(text.lower().split())


def evaluate(model_dir: str, checkpoint: str, blocks: List[Dict], examples: Dict[str, np.ndarray],
             recall_k: int = 5, batch_size: int = 32,
             model_config: Optional[configs.RealmModelConfig] = None,
             reader_checkpoint: Optional[str] = None) -> Dict[str, float]:
  """Evaluates ``checkpoint`` (of the model in ``model_dir``) on parsed eval examples.

  Args:
    reader_checkpoint: take the reader from here instead (e.g. to evaluate REALM's starting
      point: ICT towers and the warm-started reader).
    examples: numpy arrays as ``data_prep.schema.parse_pretrain_example`` gives them, with the
      host features ``source_uid`` and ``answer``.
  """
  config = model_config or model_dir_lib.load_config(model_dir)
  tokenizer = RealmTokenizer(config.vocab_file, lower_case=config.lower_case)
  model = RealmPretrainer.from_config_dataclass(config)
  model_dir_lib.restore(checkpoint, query_embedder=model.query_embedder,
                        block_embedder=model.block_embedder)
  model_dir_lib.restore(reader_checkpoint or checkpoint, allow_missing=True, reader=model.reader)
  builder = retrieval_inputs.CandidateBuilder(blocks, config, None, tokenizer.cls_id,
                                              tokenizer.sep_id)
  embed_b = tf.function(lambda x: model.block_embedder(x, training=False), reduce_retracing=True)
  embed_q = tf.function(lambda x: model.query_embedder(x, training=False), reduce_retracing=True)
  n_blocks = builder.null_row  # rows of the packed arrays past this one: the null block
  block_emb = np.concatenate([
      embed_b(dict(input_word_ids=builder.block_word_ids[i:min(i + 256, n_blocks)],
                   input_mask=builder.block_mask[i:min(i + 256, n_blocks)],
                   input_type_ids=builder.block_type_ids[i:min(i + 256, n_blocks)])).numpy()
      for i in range(0, n_blocks, 256)])
  bodies = [_normalize(b["body"]) for b in blocks]

  @tf.function
  def score(features):
    out = model(features, training=False)
    return losses.realm_metrics(out["retrieval_logits"], out["mlm_logits"],
                                features["mlm_ids"], features["mlm_weights"])

  n = len(examples["query_ids"])
  hits, utility, correct, tokens = 0, 0.0, 0.0, 0.0
  depth = max(recall_k, config.num_candidates - 1) + builder.search_slack
  for start in range(0, n, batch_size):
    batch = {k: v[start:start + batch_size] for k, v in examples.items()}
    q = embed_q(dict(input_word_ids=batch["query_ids"].astype(np.int32),
                     input_mask=batch["query_mask"].astype(np.int32),
                     input_type_ids=np.zeros_like(batch["query_ids"], np.int32))).numpy()
    ranked = np.argsort(-(q @ block_emb.T), axis=1)[:, :depth]
    for row, uid, answer in zip(ranked, batch["source_uid"], batch["answer"]):
      uid = uid.decode() if isinstance(uid, bytes) else uid
      answer = _normalize(answer.decode() if isinstance(answer, bytes) else answer)
      top = [b for b in row if blocks[b]["uid"] != uid][:recall_k]
      hits += any(answer in bodies[b] for b in top)
    candidates = builder.select_candidates(ranked, batch["source_uid"])
    features = builder.features(batch, candidates=candidates)
    m = score({k: tf.constant(features[k]) for k in realm_pretrain.DEVICE_FEATURES})
    utility += float(tf.reduce_sum(m["retrieval_utility"]))
    correct += float(tf.reduce_sum(m["correct"]))
    tokens += float(tf.reduce_sum(m["num_tokens"]))
  return {f"recall@{recall_k}": hits / max(n, 1), "retrieval_utility": utility / max(n, 1),
          "mlm_accuracy": correct / max(tokens, 1.0), "examples": n,
          "step": model_dir_lib.checkpoint_step(checkpoint)}
