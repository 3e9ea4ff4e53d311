r"""realm-train: ICT warm start or REALM pre-training, Model Garden style.

  realm-train --experiment=ict_cpu --config_file=ict.yaml --model_dir=runs/ict
  realm-train --experiment=realm_pretrain_cpu --model_dir=runs/realm \
      --params_override="task.index_dir=runs/index,task.train_data.input_path=..."

On Cloud TPU: ``--experiment=realm_pretrain_paper --tpu=$TPU_NAME`` (see README). The refresher
(``realm-refresh``) must run beside REALM pre-training to publish indexes.
"""

from absl import flags
from absl import logging

from realm_tf import configs
from realm_tf.binaries import cli
from realm_tf.tasks import ict  # noqa: F401  pylint: disable=unused-import  (registers the task)
from realm_tf.tasks import reader_mlm  # pylint: disable=unused-import
from realm_tf.tasks import reader_read  # pylint: disable=unused-import
from realm_tf.tasks import realm_pretrain  # pylint: disable=unused-import
from realm_tf.tasks import retrieval_inputs
from realm_tf.tasks import train_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("experiment", None, "Registered experiment name.")
flags.DEFINE_multi_string("config_file", [], "YAML files layered over the experiment.")
flags.DEFINE_string("params_override", "", "Comma-separated overrides, e.g. a.b=1,c=x.")
flags.DEFINE_string("model_dir", None, "Checkpoints, summaries and TRAINING_DONE go here.")
flags.DEFINE_string("tpu", None, "Cloud TPU name or grpc:// address (TPUStrategy).")
flags.DEFINE_string("strategy", None, "Override runtime.distribution_strategy "
                    "(default, mirrored, multi_worker_mirrored, tpu).")
flags.mark_flags_as_required(["experiment", "model_dir"])


def build_task(params):
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  return task_factory.get_task(params.task)


def main(argv):
  del argv
  params = configs.load_experiment(FLAGS.experiment, FLAGS.config_file, FLAGS.params_override)
  strategy = train_lib.get_strategy(
      FLAGS.strategy or params.runtime.distribution_strategy or "default", tpu=FLAGS.tpu,
      num_gpus=params.runtime.num_gpus)
  logging.info("experiment %s on %s", FLAGS.experiment, type(strategy).__name__)
  metrics = train_lib.run(build_task(params), params, FLAGS.model_dir, strategy)
  print(f"done: {FLAGS.model_dir} {({k: round(v, 4) for k, v in metrics.items()})}")


def run():
  from data_prep import schema  # pylint: disable=g-import-not-at-top
  from realm_tf.retrieval import errors  # pylint: disable=g-import-not-at-top
  cli.run_main(main, extra_errors=[retrieval_inputs.InputError, errors.RetrievalError,
                                   errors.IndexNotReadyError, schema.MissingOutputError])


if __name__ == "__main__":
  run()
