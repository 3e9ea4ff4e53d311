"""What the host CPU is and which of its instructions matter here, from ``/proc/cpuinfo``.

No TensorFlow: a timing or a refusal can name the machine before anything heavy is imported.
Machines here differ up to ~3x in speed (AVX2 only against AVX-512 with bfloat16), so every
recorded time carries ``cpu_model()``.
"""

import os
import platform
from typing import FrozenSet, Optional, Tuple

CPUINFO = "/proc/cpuinfo"
# The extensions that decide TensorFlow's CPU speed and bfloat16 arithmetic, as cpuinfo names them.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _cpuinfo(path: str = CPUINFO) -> Tuple[str, FrozenSet[str]]:
  """The first processor's ``model name`` and ``flags`` ("" and an empty set if unreadable)."""
  name, flags = "", frozenset()
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
          name = value.strip()
        elif key == "flags" and not flags:
          flags = frozenset(value.split())
        if name and flags:
          break
  except OSError:
    pass
  return name, flags


def cpu_flags(path: str = CPUINFO) -> FrozenSet[str]:
  """The CPU's instruction flags (empty where ``/proc/cpuinfo`` cannot be read)."""
  return _cpuinfo(path)[1]


def cpu_model(path: str = CPUINFO) -> str:
  """One line naming the CPU, its core count and the speed-deciding extensions it has, e.g.
  ``AMD EPYC, 2 cores, avx2 avx512f avx512_bf16``."""
  name, flags = _cpuinfo(path)
  have = [f for f in SPEED_FLAGS if f in flags]
  return (f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{' '.join(have) if have else 'none of ' + ' '.join(SPEED_FLAGS)}")


# --------------------------------------------------------------------------- bfloat16 --
# The instructions with which oneDNN computes bfloat16 in hardware, accumulating in float32.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def onednn_enabled(environ=None) -> bool:
  """Whether TensorFlow runs oneDNN's kernels: on by default on x86, off with
  ``TF_ENABLE_ONEDNN_OPTS=0`` (or ``false``), as TensorFlow reads it."""
  value = (os.environ if environ is None else environ).get("TF_ENABLE_ONEDNN_OPTS", "1")
  return value.strip().lower() not in ("0", "false")


def cpu_bfloat16_problem(path: str = CPUINFO, environ=None) -> Optional[str]:
  """None where TensorFlow computes bfloat16 on this CPU as a TPU does (oneDNN's kernels on
  ``avx512_bf16`` or ``amx_bf16``: products in bfloat16, sums in float32); otherwise why not,
  in one line. Elsewhere TensorFlow's own (Eigen) kernels run, and their ``Softmax`` and
  ``Einsum`` round to bfloat16 at every step (experiments/NOTES.md section 42)."""
  flags = cpu_flags(path)
  cause = None
  if not any(f in flags for f in BF16_FLAGS):
    cause = f"this CPU ({cpu_model(path)}) lacks {' and '.join(BF16_FLAGS)}"
  elif not onednn_enabled(environ):
    cause = "TF_ENABLE_ONEDNN_OPTS=0 turns oneDNN off"
  if cause is None:
    return None
  return (f"bfloat16 training on the CPU is refused: {cause}, so TensorFlow's own kernels would "
          "compute it and their Softmax and Einsum round every partial result to bfloat16 "
          "(experiments/NOTES.md section 42); float32 is the default")
