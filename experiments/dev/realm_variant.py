r"""Dev only: one REALM pre-training run on real text in an existing ``experiments.real_text.main``
work directory, from a chosen reader (and towers), with budget fields and task settings
overridden; its curves into ``<work>/realm_<seed>_dev.json``. Seeds are 100 or more (dev).

usage: python -m experiments.dev.realm_variant WORK SEED READER_DIR [field=value ...]
  field: a ``text_realm.RealmBudget`` field (``realm_steps=300``) or a task setting
  (``task.lr_retriever=3.0``, ``task.retriever_init_checkpoint=<work>/realm_103``).
NOTES 34-35 ran it as ``/work/runs/realm_dev2.py SEED READER ...`` with WORK fixed.
"""
import dataclasses
import json
import os

from absl import app

from experiments import assets
from experiments.pipeline.common import Clock
from experiments.real_text import text_realm


def value(field: str, text: str):
  """A budget field's value of its own type; a task setting's as a number where it is one."""
  if "." in field:
    try:
      return float(text)
    except ValueError:
      return text
  kind = type(getattr(text_realm.RealmBudget(), field))
  if kind is bool:
    if text not in ("True", "False"):
      raise SystemExit(f"{field}={text}: True or False")
    return text == "True"
  return kind(float(text)) if kind is int else kind(text)


def main(argv):
  work, seed, reader = argv[1], int(argv[2]), argv[3]
  if seed < 100:
    raise SystemExit("dev seeds are 100 or more")
  fields, more = {}, {"task.reader_init_checkpoint": os.path.join(work, reader)}
  for arg in argv[4:]:
    k, v = arg.split("=", 1)
    (more if "." in k else fields)[k] = value(k, v)
  vocab = str(assets.BERT_VOCAB)
  budget = dataclasses.replace(text_realm.RealmBudget(), **fields)
  print("budget", budget, "more", more, flush=True)
  out = text_realm.pretrain_realm(Clock("realm_dev"), work, vocab, budget, seed, more=more)
  out["reader"], out["more"] = reader, more
  with open(os.path.join(work, f"realm_{seed}_dev.json"), "w") as f:
    json.dump(out, f, indent=1)
  print(json.dumps(out["validation"]))


if __name__ == "__main__":
  app.run(main)
