"""Open-QA: ORQA's host-side inputs (``inputs``), answering with evidence (``predict``,
``realm_tf.OpenQA``) and exact-match evaluation (``evaluation``, ``realm-eval``)."""
