r"""Dev only: how much of a tower's zero-shot recall the shared query direction costs.

For each ``name=model_dir`` in ``WORK``: dev questions (``qa/realm-dev.jsonl``, REALM's 1,000
validation questions) against every block (at 288 wordpieces, as the test rows), recall@5 and
@20 with the raw scores and with each query minus the questions' mean query (which removes
the query-independent prior ``mean . block`` from every score; no answer is used), paired by
question. NOTES 35.

usage: python -m experiments.dev.centred_recall WORK name=dir [name=dir ...]
"""
import json
import os

from absl import app
import numpy as np

from experiments.real_text import text_stages as ts
from realm_tf import model_dir as model_dir_lib
from realm_tf.data import manifests
from realm_tf.data import qa


def compare(q: np.ndarray, block_emb: np.ndarray, bodies, records) -> dict:
  """Raw and centred first-hit ranks -> recalls and the paired count of questions gained and
  lost at 5."""
  raw = ts.first_hits(ts.top_k(q, block_emb, 20), bodies, records)
  centred = ts.first_hits(ts.top_k(q - q.mean(0), block_emb, 20), bodies, records)
  return {"raw": {f"recall@{k}": float(np.mean(raw < k)) for k in (5, 20)},
          "centred": {f"recall@{k}": float(np.mean(centred < k)) for k in (5, 20)},
          "gained@5": int(np.sum((centred < 5) & (raw >= 5))),
          "lost@5": int(np.sum((raw < 5) & (centred >= 5))), "questions": len(records)}


def main(argv):
  work = argv[1]
  blocks = manifests.read_blocks(os.path.join(work, "blocks"))
  records, _ = qa.read_qa(os.path.join(work, "qa", "realm-dev.jsonl"))
  length = model_dir_lib.load_config(
      os.path.join(work, "minilm_model")).retriever.query_seq_length
  ids = np.array([b["block_id"] for b in blocks])
  bodies = [None] * len(blocks)
  for b in blocks:
    bodies[b["block_id"]] = b["body"]
  out = {}
  for arg in argv[2:]:
    name, model_dir = arg.split("=", 1)
    tower = ts.TowerPass(os.path.join(work, model_dir))
    emb, _ = ts.embed_token_ids(ts.TowerPass(tower.embedder, "block"),
                                [b["token_ids"] for b in blocks], 288, 32)
    block_emb = np.zeros_like(emb)
    block_emb[ids] = emb
    q, _ = ts.embed_token_ids(tower, ts.question_rows(tower.embedder.tokenizer, records, length),
                              length, 32, type_ids=False)
    out[name] = compare(q, block_emb, bodies, records)
    print(name, json.dumps(out[name]), flush=True)
  print(json.dumps(out))


if __name__ == "__main__":
  app.run(main)
