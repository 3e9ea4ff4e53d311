"""realm_tf.hardware: the CPU named from /proc/cpuinfo, as every recorded time carries it."""
from realm_tf import hardware

AMD_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx avx2 fma
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx avx2 fma
"""
INTEL_AMX = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
"""


def test_cpu_model_names_the_cpu_and_its_speed_deciding_extensions(tmp_path):
  avx2, amx = tmp_path / "avx2", tmp_path / "amx"
  avx2.write_text(AMD_AVX2)
  amx.write_text(INTEL_AMX)
  assert hardware.cpu_flags(str(avx2)) == {"fpu", "sse", "sse2", "avx", "avx2", "fma"}
  assert hardware.cpu_model(str(avx2)).startswith("AMD EPYC 7B13, ")
  assert hardware.cpu_model(str(avx2)).endswith(" cores, avx2")
  assert hardware.cpu_model(str(amx)).endswith(" cores, avx2 avx512f avx512_bf16 amx_bf16")


def test_an_unreadable_cpuinfo_gives_no_flags_and_still_a_name(tmp_path):
  missing = str(tmp_path / "none")
  assert hardware.cpu_flags(missing) == frozenset()
  assert "none of avx2" in hardware.cpu_model(missing)


def test_bfloat16_is_computed_only_with_bf16_instructions_and_onednn(tmp_path):
  """The refusal names the missing instructions, or oneDNN turned off, in one line."""
  avx2, amx = tmp_path / "avx2", tmp_path / "amx"
  avx2.write_text(AMD_AVX2)
  amx.write_text(INTEL_AMX)
  assert hardware.cpu_bfloat16_problem(str(amx), environ={}) is None
  assert hardware.cpu_bfloat16_problem(str(amx), environ={"TF_ENABLE_ONEDNN_OPTS": "1"}) is None
  for off in ("0", "false", "False"):
    problem = hardware.cpu_bfloat16_problem(str(amx), environ={"TF_ENABLE_ONEDNN_OPTS": off})
    assert "TF_ENABLE_ONEDNN_OPTS=0 turns oneDNN off" in problem
  problem = hardware.cpu_bfloat16_problem(str(avx2), environ={})
  assert problem == (
      "bfloat16 training on the CPU is refused: this CPU (AMD EPYC 7B13, "
      f"{hardware.os.cpu_count()} cores, avx2) lacks avx512_bf16 and amx_bf16, so TensorFlow's "
      "own kernels would compute it and their Softmax and Einsum round every partial result "
      "to bfloat16 (experiments/NOTES.md section 42); float32 is the default")
