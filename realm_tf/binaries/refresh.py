r"""realm-refresh: keeps an index fresh while a trainer writes checkpoints.

    realm-refresh --model_dir=runs/pretrain --index_dir=runs/pretrain/index \
        --blocks_dir=data/blocks --keep=3 --min_step_interval=500

Polls ``--model_dir`` for checkpoints, rebuilds the index of the newest one (at most every
``--min_step_interval`` steps), publishes ``--index_dir/step-<N>`` and moves ``LATEST``, keeps
the last ``--keep``, and exits after the trainer writes ``TRAINING_DONE``. Safe to kill and
restart at any moment.
"""

from absl import flags

from realm_tf.binaries import cli
from realm_tf.binaries import index_flags
from realm_tf.retrieval import errors
from realm_tf.retrieval.publication import refresher

flags.DEFINE_string("model_dir", None, "The trainer's model directory.")
flags.DEFINE_string("index_dir", None, "Where to publish indexes (step-<N>/ and LATEST).")
flags.DEFINE_string("blocks_dir", None, "The blocks directory (the blocks pipeline's output).")
flags.DEFINE_integer("keep", 3, "Indexes to keep.")
flags.DEFINE_integer("min_step_interval", 0,
                     "Rebuild at most once every this many steps (0: every new checkpoint).")
flags.DEFINE_float("poll_seconds", 30.0, "How often to look for a new checkpoint.")
flags.DEFINE_bool("exit_when_done", True, "Exit once TRAINING_DONE exists and the last "
                  "checkpoint is indexed.")
flags.DEFINE_integer("max_builds", 0, "Exit after this many builds (0: no limit).")
flags.DEFINE_float("model_dir_wait_seconds", 0.0,
                   "Wait this long for --model_dir to appear before failing.")
index_flags.define_build_flags()
flags.mark_flags_as_required(["model_dir", "index_dir", "blocks_dir"])

FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise errors.RetrievalError(f"unexpected arguments: {' '.join(argv[1:])}")
  options = index_flags.build_options_from_flags(FLAGS, keep=FLAGS.keep)
  refresher.refresh_loop(FLAGS.model_dir, FLAGS.index_dir, FLAGS.blocks_dir, keep=FLAGS.keep,
                         min_step_interval=FLAGS.min_step_interval,
                         poll_seconds=FLAGS.poll_seconds, exit_when_done=FLAGS.exit_when_done,
                         max_builds=FLAGS.max_builds or None, options=options,
                         model_dir_wait_seconds=FLAGS.model_dir_wait_seconds)


def run():
  cli.run_main(main)


if __name__ == "__main__":
  run()
