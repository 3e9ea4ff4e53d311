"""What REALM's tasks share on top of Model Garden's ``base_task.Task``."""

import tensorflow as tf
from official.core import base_task

from realm_tf import model_dir as model_dir_lib
from realm_tf.modeling import losses


class RealmBaseTask(base_task.Task):
  """A task whose loss and metric updates are one method, ``forward``.

  ``forward(inputs, model, metrics, training)`` returns this replica's share of the global
  mean loss (``losses.global_mean_share``) and updates ``metrics``; the train and validation
  steps are built from it. The logged ``loss`` is the share times the number of replicas, so
  Model Garden's mean over replicas and steps is the global mean.
  """

  def initialize(self, model):
    """Restores ``model.checkpoint_items`` from ``init_checkpoint`` (a model directory or a
    checkpoint), when given; items missing from it keep their fresh initialization."""
    if self.task_config.init_checkpoint:
      # allow_missing: a warm start, not a reload. The start may hold part of the model only
      # (BERT has no projection for ICT's towers); the rest starts fresh, and a variable of
      # another shape is still refused.
      model_dir_lib.restore(model_dir_lib.resolve_checkpoint(self.task_config.init_checkpoint),
                            allow_missing=True, **model.checkpoint_items)

  def forward(self, inputs, model, metrics, training: bool) -> tf.Tensor:
    raise NotImplementedError

  def train_step(self, inputs, model, optimizer, metrics=None):
    with tf.GradientTape() as tape:
      loss = self.forward(inputs, model, metrics, training=True)
    variables = model.trainable_variables
    # A variable without a gradient (a reader's pooler, unused by the MLM loss) is left out.
    pairs = [(g, v) for g, v in zip(tape.gradient(loss, variables), variables) if g is not None]
    scaled = [(vs, c) for vs, c in self.update_scales(model) if c != 1.0]
    before = [[tf.identity(v) for v in vs] for vs, _ in scaled]
    optimizer.apply_gradients(self.transform_gradients(pairs, model, optimizer))
    for (vs, c), olds in zip(scaled, before):
      scale_updates(vs, olds, c)
    return {self.loss: loss * losses.num_replicas()}

  def update_scales(self, model):
    """``[(variables, c)]``: the optimizer's update of these variables is multiplied by ``c``
    (a learning-rate multiplier for a group of variables; REALM: ``lr_retriever``). None here."""
    del model
    return []

  def transform_gradients(self, grads_and_vars, model, optimizer):
    """``(gradient, variable)`` pairs -> the pairs applied (REALM: the frozen retriever's
    first steps); before the optimizer's own clipping. Identity here."""
    del model, optimizer
    return grads_and_vars

  def validation_step(self, inputs, model, metrics=None):
    loss = self.forward(inputs, model, metrics, training=False)
    return {self.loss: loss * losses.num_replicas()}


def scale_updates(variables, before, c: float):
  """``v = before + c * (v - before)`` for each variable: the step the optimizer just took,
  multiplied by ``c``.

  This is a learning rate of ``c`` times the optimizer's for these variables whenever the step
  is linear in the learning rate, as Adam's and AdamW's (decoupled weight decay included) are:
  their moments still see the whole gradient, as with a parameter group of its own rate
  (Atlas's ``lr_retriever``). Scaling the gradient instead would not do it: Adam's step is
  invariant to the gradient's scale. Runs in a replica context (the train step) through
  ``merge_call``, as an optimizer's own updates do, so mirrored variables stay in sync.
  """
  def assign(strategy, before):
    for v, old in zip(variables, before):
      strategy.extended.update(v, lambda var, o: var.assign(o + c * (var - o)), args=(old,))

  ctx = tf.distribute.get_replica_context()
  if ctx is None:
    assign(tf.distribute.get_strategy(), before)
  else:
    ctx.merge_call(assign, args=(before,))
