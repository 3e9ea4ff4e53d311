"""In-graph tokenization against the reference BERT tokenizer, and REALM's packing."""

import json
import os

import tensorflow as tf
from official.nlp.tools import tokenization as reference

from experiments import assets
from realm_tf import tokenization

VOCAB = str(assets.BERT_VOCAB)


def squad_sentences(n):
  """The first n sentences (naively split) of SQuAD dev contexts, plus its questions."""
  data = assets.squad_dev()["data"]
  out = []
  for article in data:
    for para in article["paragraphs"]:
      out.extend(s.strip() + "." for s in para["context"].split(". ") if s.strip())
      out.extend(qa["question"] for qa in para["qas"][:1])
      if len(out) >= n:
        return out[:n]
  return out


class TokenizationTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = tokenization.RealmTokenizer(VOCAB, lower_case=True)

  def test_agrees_with_reference_bert_tokenizer(self):
    ref = reference.FullTokenizer(VOCAB, do_lower_case=True)
    sentences = squad_sentences(600)
    # Make sure the sample exercises accents, digits and punctuation.
    self.assertTrue(any(any(ord(c) > 127 for c in s) for s in sentences))
    self.assertTrue(any(any(c.isdigit() for c in s) for s in sentences))
    got = self.tok.tokenize(sentences)
    mismatches = []
    for sentence, ids in zip(sentences, got):
      want = ref.convert_tokens_to_ids(ref.tokenize(sentence))
      if ids.numpy().tolist() != want:
        mismatches.append(sentence)
    self.assertGreaterEqual(len(sentences), 600)
    self.assertEqual(mismatches, [])

  def test_hand_checked_examples(self):
    self.assertEqual(self.tok.tokenize_to_strings("Café naïve, 1,234!"),
                     ["cafe", "naive", ",", "1", ",", "234", "!"])

  def test_query_block_reader_layouts(self):
    q = self.tok.query_inputs(["Who wrote Hamlet?"], seq_length=8)
    self.assertEqual(self.tok.convert_ids_to_tokens(q["input_word_ids"][0]),
                     ["[CLS]", "who", "wrote", "hamlet", "?", "[SEP]", "[PAD]", "[PAD]"])
    self.assertAllEqual(q["input_mask"][0], [1, 1, 1, 1, 1, 1, 0, 0])
    self.assertAllEqual(q["input_type_ids"][0], [0] * 8)
    b = self.tok.block_inputs(["Hamlet"], ["A tragedy by Shakespeare."], seq_length=12)
    self.assertEqual(self.tok.convert_ids_to_tokens(b["input_word_ids"][0])[:9],
                     ["[CLS]", "hamlet", "[SEP]", "a", "tragedy", "by", "shakespeare", ".",
                      "[SEP]"])
    self.assertAllEqual(b["input_type_ids"][0], [0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0])
    # Reader: the body is trimmed first, the query stays whole.
    r = self.tok.reader_inputs(["who wrote hamlet ?"], ["a tragedy by shakespeare ."], 9)
    self.assertEqual(self.tok.convert_ids_to_tokens(r["input_word_ids"][0]),
                     ["[CLS]", "who", "wrote", "hamlet", "?", "[SEP]", "a", "tragedy", "[SEP]"])
    self.assertEqual(r["input_word_ids"].dtype, tf.int32)

  def test_usable_inside_tf_data(self):
    ds = tf.data.Dataset.from_tensor_slices(["a b", "the play"]).batch(2).map(
        lambda q: self.tok.query_inputs(q, 16))
    batch = next(iter(ds))
    self.assertEqual(batch["input_word_ids"].shape, (2, 16))

  def test_bad_vocab_paths(self):
    with self.assertRaisesRegex(tokenization.VocabError, "vocab file not found: /nope"):
      tokenization.RealmTokenizer("/nope/vocab.txt")
    path = os.path.join(self.get_temp_dir(), "v.txt")
    with open(path, "w") as f:
      f.write("[PAD]\n[UNK]\nhello\n")
    with self.assertRaisesRegex(tokenization.VocabError, "lacks the special tokens"):
      tokenization.RealmTokenizer(path)

  def test_learn_vocab(self):
    texts = ["Zorvath was born in Kelmira in 1843.", "Kelmira is a city on the Ostrel river."] * 30
    path = os.path.join(self.get_temp_dir(), "learned.txt")
    vocab = tokenization.learn_vocab(texts, path, vocab_size=200)
    self.assertEqual(vocab[:5], list(tokenization.RESERVED_TOKENS))
    tok = tokenization.RealmTokenizer(path)
    pieces = tok.tokenize_to_strings("Zorvath was born in Kelmira")
    self.assertNotIn("[UNK]", pieces)
    self.assertEqual("".join(p.replace("##", "") for p in pieces), "zorvathwasborninkelmira")


if __name__ == "__main__":
  tf.test.main()
