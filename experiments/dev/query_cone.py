r"""Dev only: how far a REALM query tower folds held-out queries into one direction.

For each ``name=checkpoint`` (a model directory or a checkpoint path in ``WORK``): the query
tower's embeddings of the first 400 held-out masked sentences, their mean pairwise cosine, the
share of their squared norm along their mean, and whether the tower's last LayerNorm bias
(a direction shared by every query) carries it. NOTES 35.

usage: python -m experiments.dev.query_cone WORK name=path [name=path ...]
"""
import json
import os

from absl import app
import numpy as np

from realm_tf import configs
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import loaders
from realm_tf.modeling import factory


def cone(embeddings: np.ndarray, beta: np.ndarray) -> dict:
  mean = embeddings.mean(0)
  unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
  scale = np.linalg.norm(mean) * np.linalg.norm(beta)
  return dict(
      mean_pair_cosine=float((unit @ unit.T)[np.triu_indices(len(unit), 1)].mean()),
      mean_share_of_norm2=float(mean @ mean / (embeddings ** 2).sum(1).mean()),
      beta_norm=float(np.linalg.norm(beta)),
      cos_mean_beta=float(mean @ beta / scale) if scale else 0.0)


def main(argv):
  work = argv[1]
  examples = loaders.MaskedExamplesLoader(
      configs.MaskedLmDataConfig(is_training=False), 64, 10,
      input_path=os.path.join(work, "pretrain", "eval-*")).read_all()
  ids, mask = examples["query_ids"][:400], examples["query_mask"][:400]
  out = {}
  for arg in argv[2:]:
    name, path = arg.split("=", 1)
    path = os.path.join(work, path)
    config = model_dir_lib.load_config(path if os.path.isdir(path) else os.path.dirname(path))
    config.retriever.share_embedders = False       # the query tower alone
    tower, _ = factory.build_embedders(config.retriever)
    model_dir_lib.restore(model_dir_lib.resolve_checkpoint(path), query_embedder=tower)
    emb = np.concatenate([tower(dict(input_word_ids=ids[i:i + 100], input_mask=mask[i:i + 100],
                                     input_type_ids=np.zeros_like(ids[i:i + 100])),
                                training=False).numpy() for i in range(0, len(ids), 100)])
    out[name] = cone(emb, tower.layer_norm.beta.numpy())
    print(name, {k: round(v, 3) for k, v in out[name].items()}, flush=True)
  print(json.dumps(out))


if __name__ == "__main__":
  app.run(main)
