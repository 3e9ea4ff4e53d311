"""Each orbit line reaches the console once (issue 43): orbit's controller both logs and
prints its lines, and ``train_lib`` drops the absl copy."""

import logging
import os

from absl import logging as absl_logging
import orbit

from realm_tf import train_lib


def record(pathname, level=logging.INFO):
  return logging.LogRecord("absl", level, pathname, 1, "train | step: 25", None, None)


def test_orbit_info_lines_are_left_to_its_print():
  train_lib._log_orbit_lines_once()
  train_lib._log_orbit_lines_once()   # idempotent: one filter
  handler = absl_logging.get_absl_handler()
  filters = [f for f in handler.filters if isinstance(f, train_lib._NoOrbitInfoCopy)]
  assert len(filters) == 1
  controller = os.path.join(os.path.dirname(orbit.__file__), "controller.py")
  assert os.path.exists(controller)
  assert not handler.filter(record(controller))                        # printed by orbit
  assert handler.filter(record(controller, logging.WARNING))           # not printed: kept
  assert handler.filter(record(train_lib.__file__))                    # ours: kept
