"""The exported folders through the real libraries (sentence-transformers, transformers on CPU
torch), run in the slow tier's own environment (.venv-hf: make test-all), never beside
TensorFlow. usage: python hf_side.py REQUEST.json OUT.npz

REQUEST: {"export_dir", "queries": [...], "blocks": [[title, body], ...] (optional),
          "mlm": {"input_ids", "attention_mask", "token_type_ids", "positions"} (optional)}
OUT: query_embeddings, query_ids (the Hugging Face tokenizer's ids of the queries, padded with
-1), block_embeddings, mlm_logits (at the positions).
"""
import json
import os
import sys

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer
from transformers import BertForMaskedLM


def main(request_path, out_path):
  with open(request_path, encoding="utf-8") as f:
    request = json.load(f)
  root = request["export_dir"]
  out = {}
  query_tower = os.path.join(root, "query_tower")
  model = SentenceTransformer(query_tower, device="cpu")
  out["query_embeddings"] = model.encode(request["queries"], batch_size=64,
                                         convert_to_numpy=True)
  ids = AutoTokenizer.from_pretrained(query_tower)(request["queries"])["input_ids"]
  width = max(len(i) for i in ids)
  out["query_ids"] = np.array([i + [-1] * (width - len(i)) for i in ids])
  if request.get("blocks"):
    blocks = SentenceTransformer(os.path.join(root, "block_tower"), device="cpu")
    out["block_embeddings"] = blocks.encode([list(b) for b in request["blocks"]],
                                            convert_to_numpy=True)
  if request.get("mlm"):
    mlm = request["mlm"]
    reader = BertForMaskedLM.from_pretrained(os.path.join(root, "reader")).eval()
    with torch.no_grad():
      logits = reader(input_ids=torch.tensor(mlm["input_ids"]),
                      attention_mask=torch.tensor(mlm["attention_mask"]),
                      token_type_ids=torch.tensor(mlm["token_type_ids"])).logits.numpy()
    positions = np.array(mlm["positions"])
    out["mlm_logits"] = np.take_along_axis(logits, positions[:, :, None], axis=1)
  np.savez(out_path, **out)


if __name__ == "__main__":
  main(*sys.argv[1:])
