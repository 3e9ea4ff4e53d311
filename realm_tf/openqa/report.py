"""realm-answer's text report of an answer: the answer, its score and the blocks read, the answer
bracketed in its block (``... [[answer]] ...``). A library module, so that it is used and tested
without the binary's flags."""

from realm_tf.openqa import predict


def _squash(text: str) -> str:
  return " ".join(text.split())


def snippet(text: str, start: int = -1, end: int = -1, width: int = 160) -> str:
  """About ``width`` characters of ``text``, whitespace collapsed; with ``0 <= start < end``,
  the window around ``text[start:end]``, bracketed as ``[[...]]``."""
  if not 0 <= start < end <= len(text):
    flat = _squash(text)
    return flat[:width] + "..." if len(flat) > width else flat
  answer = _squash(text[start:end])
  room = max(0, width - len(answer)) // 2
  left, right = _squash(text[:start]), _squash(text[end:])
  left_cut, right_cut = left[-room:] if room else "", right[:room]
  pre = ("..." if len(left_cut) < len(left) else "") + left_cut
  post = right_cut + ("..." if len(right_cut) < len(right) else "")
  pad_left = " " if left and text[start - 1].isspace() else ""
  pad_right = " " if right and text[end].isspace() else ""
  return f"{pre}{pad_left}[[{answer}]]{pad_right}{post}".strip()


def found_by(e: predict.Evidence) -> str:
  """Which retriever found a block, at which rank (from 1): "dense #1, bm25 #3"."""
  ranks = [f"{name} #{rank + 1}" for name, rank in (("dense", e.dense_rank),
                                                     ("bm25", e.bm25_rank)) if rank >= 0]
  return ", ".join(ranks) or "given beam"


def format_answer(answer: predict.Answer, width: int = 160) -> str:
  """The text report of one answer: answer, score and the evidence read."""
  lines = [f"question: {answer.question}",
           f"answer:   {answer.answer or '(none)'}   (score {answer.score:.3f})",
           f"evidence ({len(answer.evidence)} blocks read):"]
  for rank, e in enumerate(answer.evidence):
    here = rank == answer.block_rank and bool(answer.answer)
    mark = "*" if here else " "
    lines.append(f" {mark}{rank + 1:2d}. [{e.retrieval_score:8.3f}] {e.title}  "
                 f"(block {e.block_id}; {found_by(e)})")
    lines.append("      " + (snippet(e.text, answer.start, answer.end, width) if here
                             else snippet(e.text, width=width)))
  return "\n".join(lines)
