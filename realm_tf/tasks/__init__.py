"""REALM's Model Garden tasks; importing this package registers them with the task factory.

* ``ict``: ORQA's Inverse Cloze Task, the retriever's warm start;
* ``reader_read``: the toy reader's reading warm start (stands in for BERT);
* ``reader_mlm``: BERT's masked LM for a reader that never had it (MiniLM on real text);
* ``realm_pretrain``: REALM pre-training, with held-out validation;
* ``openqa``: ORQA's Open-QA fine-tuning, with dev EM and the best checkpoint kept.
"""

from realm_tf.tasks import ict
from realm_tf.tasks import reader_read
from realm_tf.tasks import reader_mlm
from realm_tf.tasks import realm_pretrain
from realm_tf.tasks import openqa
