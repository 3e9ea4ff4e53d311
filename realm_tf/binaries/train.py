r"""realm-train: ICT, the reader's warm starts, REALM pre-training; Model Garden style.

  realm-train --experiment=ict_cpu --mode=train --config_file=ict.yaml --model_dir=runs/ict
  realm-train --experiment=realm_pretrain_cpu --mode=train_and_eval --model_dir=runs/realm \
      --params_override="task.index_dir=runs/index,task.train_data.input_path=..."
  realm-train --experiment=realm_pretrain_cpu --mode=eval --model_dir=runs/realm ...

The flags are Model Garden's (``official.common.flags``); ``--mode`` is one of train, eval,
train_and_eval, continuous_eval. On Cloud TPU: ``--experiment=realm_pretrain_paper
--tpu=$TPU_NAME`` (see README). REALM pre-training needs ``realm-refresh`` running beside it.

A paper-scale experiment (``*_paper``) starts from trained weights, as the paper does (ICT from
BERT-base, REALM from ICT and BERT-base, Open-QA from REALM): training one whose init checkpoints
are unset or still ``REPLACE_ME`` placeholders is refused unless ``--allow_random_init``.
"""

from absl import flags
from official.common import flags as tfm_flags

from realm_tf import configs
from realm_tf import train_lib
from realm_tf.binaries import cli
from realm_tf import tasks  # noqa: F401  pylint: disable=unused-import  (registers the tasks)

FLAGS = flags.FLAGS
flags.DEFINE_bool("allow_random_init", False,
                  "Train a paper-scale experiment without its init checkpoints (random weights).")


def main(argv):
  del argv
  params = configs.load_experiment(FLAGS.experiment, FLAGS.config_file or (),
                                   FLAGS.params_override or "")
  if FLAGS.mode not in train_lib.MODES:
    raise configs.ConfigError(f"--mode={FLAGS.mode} is not supported; use one of "
                              f"{', '.join(train_lib.MODES)}")
  if "train" in FLAGS.mode:
    configs.check_init_checkpoints(FLAGS.experiment, params, FLAGS.allow_random_init)
  strategy = train_lib.get_strategy(params, tpu=FLAGS.tpu)
  logs = train_lib.run_experiment(params, FLAGS.model_dir, FLAGS.mode, strategy)
  print(f"done ({FLAGS.mode}): {FLAGS.model_dir} "
        f"{ {k: round(v, 4) for k, v in logs.items()} }")


def run():
  tfm_flags.define_flags()
  cli.run_main(main)


if __name__ == "__main__":
  run()
