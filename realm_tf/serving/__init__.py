"""``realm-serve``: a fine-tuned Open-QA model and its index over HTTP, kept up to date live.

* ``service``: ``QAService``, the model, the newest index (hot-swapped between batches),
  micro-batching, bounded admission, and the document updates (``retrieval.publication.updates``);
* ``app``: the FastAPI app (``create_app``): ``/answer``, ``/healthz``, ``/documents``, the page
  (``page.html``) and the OpenAPI description.
"""
