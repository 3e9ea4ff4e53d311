"""The embedded default corpus: a small, deterministic, invented encyclopedia.

:func:`generate_world` builds a closed world of regions, cities, people, organizations and works
whose names are made of syllables (so no pre-trained model knows them), with dates and
attributes, and writes it as encyclopedia-style articles. **Every fact is stated in at least two
different articles, phrased differently** (a birth in the person's and in the city's article, a
work in the work's and the author's article, ...), so a fact masked in one sentence cannot be
guessed from that sentence but can be read in another block: retrieval is necessary.

Outputs (:func:`write_world`):

* ``articles.jsonl``: ``{"title", "text"}``, sentences separated by spaces, paragraphs by
  blank lines;
* ``qa.jsonl``: ``{"question", "answers": [...]}``, one question per fact (``qa[i]`` asks
  ``facts[i]``);
* ``qa-train.jsonl``, ``qa-dev.jsonl``, ``qa-test.jsonl``: the same questions as ORQA-style
  splits, ``{"question", "answers", "answer_type": "text"}`` (the format of
  ``data_prep.open_qa``), held out by question (:func:`split_qa`): a test question, and so its
  fact, is never a training question;
* ``entity_patterns.jsonl``: spaCy ``EntityRuler`` patterns (PERSON, GPE, ORG, WORK_OF_ART)
  for every invented name;
* ``facts.jsonl``: ``{"subject", "relation", "object", "articles": [titles stating it]}``;
* ``vocab.txt`` (with ``vocab_size``): a WordPiece vocabulary learned from the articles;
* ``news.jsonl``: ``{"title", "text", "date"}``, short dated news items (:func:`generate_news`)
  that restate the facts of a share of the entities in their own wording (neither the
  articles' sentences nor the questions'), mixed with items that state no fact: the paper's
  second pre-training corpus (X = CC-News, retrieving from Z = Wikipedia) at toy size;
* ``news_coverage.json``: which entities the news covers (``covered``) and which it never
  covers (``never_covered``), the share and the seed.

Example::

  python -m data_prep.synthetic_world --output_dir /tmp/world --vocab_size 3000
"""

import dataclasses
import hashlib
import json
import os
import random
from typing import Dict, List, Optional, Sequence, Tuple

from absl import flags

from data_prep import beam_utils
from data_prep import cli
from realm_tf.tokenization import learn_vocab

SYLLABLES = ("ka", "lo", "mer", "dri", "van", "tos", "bel", "quin", "zor", "thal", "rin", "wex",
             "pol", "dun", "mir", "sa", "ve", "gor", "lun", "tri", "bo", "ny", "phe", "ska",
             "rel", "jo", "xa", "ulm", "ost", "fen", "dar", "ith", "cor", "vu", "ne", "sil")
OCCUPATIONS = ("painter", "chemist", "poet", "composer", "astronomer", "architect", "novelist",
               "mathematician", "engraver", "cartographer")
GENRES = ("novel", "symphony", "treatise", "poem cycle", "atlas", "play", "chronicle")
WORK_NOUNS = ("Chronicle", "Sonata", "Atlas", "Elegy", "Letters", "Garden", "Lantern", "Canticle")
ORG_NOUNS = ("Institute", "Society", "Academy", "Guild", "Company", "Observatory", "Press")
TRAITS = ("careful", "restless", "generous", "solitary", "inventive", "patient")


@dataclasses.dataclass
class World:
  articles: List[Dict]
  qa: List[Dict]
  patterns: List[Dict]
  facts: List[Dict]


class _Names:
  def __init__(self, rng: random.Random):
    self.rng, self.used = rng, set()

  def make(self, syllables: int) -> str:
    while True:
      name = "".join(self.rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()
      if name not in self.used and len(name) >= 4:
        self.used.add(name)
        return name


def _article(noun: str) -> str:
  return ("an " if noun[0] in "aeiou" else "a ") + noun


def _list_phrase(items: List[str]) -> str:
  return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def generate_world(seed: int = 0, num_regions: int = 6, num_cities: int = 30,
                   num_people: int = 100, num_organizations: int = 24,
                   num_works: int = 50, name_seed: Optional[int] = None) -> World:
  """Builds the world; the same arguments always give the same world (``random.Random(seed)``).

  The default size gives 210 articles of 2 to 12 sentences. The names come from their own
  generator, seeded by ``name_seed`` (default: ``seed``): worlds with one ``name_seed`` and
  different ``seed`` have the same people, places, organizations and works, with other facts
  (the demo's reader learns to read on such counterfactual worlds).
  """
  rng = random.Random(seed)
  name_rng = random.Random(f"names-{seed if name_seed is None else name_seed}")
  names = _Names(name_rng)
  regions = [{"name": names.make(3), "cities": []} for _ in range(num_regions)]
  city_names = [names.make(name_rng.choice((2, 3))) for _ in range(num_cities)]
  person_names = [f"{names.make(2)} {names.make(name_rng.choice((2, 3)))}"
                  for _ in range(num_people)]
  work_names = [f"The {names.make(2)} {name_rng.choice(WORK_NOUNS)}" for _ in range(num_works)]
  org_names = [f"{names.make(name_rng.choice((2, 3)))} {name_rng.choice(ORG_NOUNS)}"
               for _ in range(num_organizations)]
  cities = []
  for i, name in enumerate(city_names):
    region = regions[i % num_regions]
    c = {"name": name, "region": region["name"],
         "founded": rng.randint(1100, 1650), "people": [], "orgs": []}
    region["cities"].append(c)
    cities.append(c)
  people = []
  for name in person_names:
    city = rng.choice(cities)
    p = {"name": name, "city": city["name"],
         "born": rng.randint(1720, 1950), "occupation": rng.choice(OCCUPATIONS),
         "trait": rng.choice(TRAITS), "works": [], "orgs": []}
    city["people"].append(p)
    people.append(p)
  works = []
  for name in work_names:
    author = rng.choice(people)
    w = {"name": name, "author": author["name"],
         "year": author["born"] + rng.randint(20, 60), "genre": rng.choice(GENRES)}
    author["works"].append(w)
    works.append(w)
  orgs = []
  for name in org_names:
    founder = rng.choice(people)
    city = rng.choice(cities)
    o = {"name": name, "founder": founder["name"], "year": founder["born"] + rng.randint(25, 55),
         "city": city["name"]}
    founder["orgs"].append(o)
    city["orgs"].append(o)
    orgs.append(o)

  articles: List[Dict] = []
  facts: Dict = {}

  def fact(subject, relation, obj, title):
    facts.setdefault((subject, relation, str(obj)), []).append(title)

  for p in people:
    t = p["name"]
    s = [f"{t} was {_article(p['occupation'])} born in {p['city']} in {p['born']}.",
         f"Friends described {t} as a {p['trait']} person."]
    fact(t, "born_in", p["city"], t)
    fact(t, "born_year", p["born"], t)
    fact(t, "occupation", p["occupation"], t)
    for w in p["works"]:
      s.append(f"In {w['year']}, {t} wrote {w['name']}, {_article(w['genre'])}.")
      fact(w["name"], "author", t, t)
      fact(w["name"], "year", w["year"], t)
    for o in p["orgs"]:
      s.append(f"{t} founded the {o['name']} in {o['year']}.")
      fact(o["name"], "founder", t, t)
      fact(o["name"], "year", o["year"], t)
    articles.append({"title": t, "text": " ".join(s)})
  for c in cities:
    t = c["name"]
    s = [f"{t} is a city in {c['region']}.",
         f"Its charter dates from {c['founded']}."]
    fact(t, "region", c["region"], t)
    fact(t, "founded", c["founded"], t)
    born = [f"{t} is the birthplace of the {p['occupation']} {p['name']}, who was born there in "
            f"{p['born']}." for p in c["people"]]
    for p in c["people"]:
      fact(p["name"], "born_in", t, t)
      fact(p["name"], "born_year", p["born"], t)
      fact(p["name"], "occupation", p["occupation"], t)
    hosted = [f"The {o['name']} has its headquarters in {t}." for o in c["orgs"]]
    for o in c["orgs"]:
      fact(o["name"], "city", t, t)
    text = " ".join(s)
    if born:
      text += "\n\nNotable people\n\n" + " ".join(born)
    if hosted:
      text += "\n\nInstitutions\n\n" + " ".join(hosted)
    articles.append({"title": t, "text": text})
  for r in regions:
    t = r["name"]
    s = [f"{t} is a region whose cities include {_list_phrase([c['name'] for c in r['cities']])}."]
    for c in r["cities"]:
      s.append(f"Settlers founded {c['name']} in {c['founded']}.")
      fact(c["name"], "region", t, t)
      fact(c["name"], "founded", c["founded"], t)
    articles.append({"title": t, "text": " ".join(s)})
  for w in works:
    t = w["name"]
    s = [f"{t} is {_article(w['genre'])} by {w['author']}, first published in {w['year']}.",
         f"Critics still debate the ending of {t}."]
    fact(t, "author", w["author"], t)
    fact(t, "year", w["year"], t)
    articles.append({"title": t, "text": " ".join(s)})
  for o in orgs:
    t = o["name"]
    s = [f"The {t} was established in {o['year']} by {o['founder']}.",
         f"The seat of the {t} is in {o['city']}."]
    fact(t, "founder", o["founder"], t)
    fact(t, "year", o["year"], t)
    fact(t, "city", o["city"], t)
    articles.append({"title": t, "text": " ".join(s)})

  questions = {
      "born_in": "Where was {s} born?",
      "born_year": "In what year was {s} born?",
      "occupation": "What was the occupation of {s}?",
      "author": "Who wrote {s}?",
      "year": "When was {s} created?",
      "founder": "Who founded the {s}?",
      "city": "In which city is the {s} based?",
      "region": "In which region is {s}?",
      "founded": "When was {s} founded?",
  }
  fact_list, qa = [], []
  for (subject, relation, obj), titles in facts.items():
    fact_list.append({"subject": subject, "relation": relation, "object": obj,
                      "articles": sorted(set(titles))})
    q = questions[relation].format(s=subject)
    if relation == "year" and subject.startswith("The ") and any(
        w["name"] == subject for w in works):
      q = f"When was {subject} first published?"
    elif relation == "year":
      q = f"When was the {subject} established?"
    qa.append({"question": q, "answers": [obj]})
  patterns = ([{"label": "PERSON", "pattern": p["name"]} for p in people] +
              [{"label": "GPE", "pattern": c["name"]} for c in cities] +
              [{"label": "GPE", "pattern": r["name"]} for r in regions] +
              [{"label": "ORG", "pattern": o["name"]} for o in orgs] +
              [{"label": "WORK_OF_ART", "pattern": w["name"]} for w in works])
  return World(articles, qa, patterns, fact_list)


# The news restates a fact in its own wording: one template per relation ({s} the subject, {o}
# the object); none is an article's sentence or a question (tests/test_data_prep_world.py).
NEWS_TEMPLATES = {
    "born_in": "Admirers gathered in {o}, the hometown of {s}, for an exhibition on Saturday.",
    "born_year": "A new biography reports that {s} came into the world in the year {o}.",
    "occupation": "Visitors learned how {s} earned a living as {o_article} for decades.",
    "author": "Booksellers report strong demand for {s}, the celebrated work of {o}.",
    "work_year": "Scholars marked the anniversary of {s}, which first reached readers in {o}.",
    "org_year": "Members of the {s} recalled its beginnings in {o} at a dinner on Friday.",
    "founder": "A portrait of {o}, the person who started the {s}, was unveiled this week.",
    "city": "The {s} plans to enlarge its offices in {o}, a spokesperson said.",
    "region": "Heavy rain closed roads around {s}, in the {o} area, on Monday.",
    "founded": "Residents of {s} held a festival for the town charter granted in {o}.",
}
# Sentences that state no fact, about a covered entity ({e}) of the kind named.
NEWS_FILLERS = {
    "person": ("Tickets for an evening honouring {e} sold out within hours.",
               "A letter signed by {e} was sold at auction this week."),
    "city": ("Markets in {e} were quiet this week, traders said.",
             "A new bridge in {e} opened to traffic on Wednesday."),
    "region": ("The weather stayed mild across {e} over the weekend.",),
    "org": ("A spokesperson for the {e} declined to comment on the rumours.",),
    "work": ("A small theatre staged a reading of {e} to a full house.",),
}
_PAPERS = ("Evening Courier", "Morning Herald", "Weekly Gazette", "Daily Ledger")


def _entity_kinds(world: World) -> Dict[str, str]:
  """Entity name -> "person", "city", "region", "org" or "work" (from the world's patterns)."""
  kinds = {}
  for p in world.patterns:
    label, name = p["label"], p["pattern"]
    kinds[name] = {"PERSON": "person", "ORG": "org", "WORK_OF_ART": "work"}.get(label, "gpe")
  regions = {f["object"] for f in world.facts if f["relation"] == "region"}
  for name, kind in kinds.items():
    if kind == "gpe":
      kinds[name] = "region" if name in regions else "city"
  return kinds


# The teaching news (``style="teaching"``, the tables'): four templates per relation, each
# with two salient spans or more ({s}, {o}; the occupation's second is the person's birthplace,
# {city}), written in the words of the encyclopedia and of the reading worlds (the starts'
# language; ``news_wording`` measures it) without being an article's sentence or a question.
TEACHING_TEMPLATES = {
    "born_in": ("The people of {o} still include {s}, who was born there.",
                "Born in {o}, {s} is still a notable person.",
                "{o} still has {s} in its notable people.",
                "Friends from {o} described {s} as a person born there."),
    "born_year": ("{s}, who was born in {o}, is still a notable person.",
                  "In {o}, the notable {s} was born.",
                  "Born in {o}, {s} was described by friends as notable.",
                  "Friends described {s}, born in {o}, as a notable person."),
    "occupation": ("{s}, {o_article} from {city}, is still a notable person.",
                   "Critics from {city} described {s} as {o_article}.",
                   "In {city}, people still debate the {o} {s}.",
                   "The people of {city} described {s} as a notable {o}."),
    "author": ("Critics still debate {s} by {o}.",
               "{o} wrote {s}, and critics still debate its ending.",
               "Notable people still debate the ending of {s}, by {o}.",
               "{o} is the person who wrote {s}."),
    "work_year": ("{s}, first published in {o}, is still notable.",
                  "In {o}, {s} was first published.",
                  "Critics still debate {s}, published in {o}.",
                  "First published in {o}, {s} has a notable ending."),
    "org_year": ("The {s}, established in {o}, still has notable people.",
                 "In {o}, the {s} was founded.",
                 "The notable people of the {s} still debate its charter from {o}.",
                 "The charter of the {s} dates from {o}."),
    "founder": ("{o} is the person who founded the {s}.",
                "The {s}, founded by {o}, is still notable.",
                "Critics described {o}, who founded the {s}, as notable.",
                "The {s} was established by the notable {o}."),
    "city": ("The {s} has its seat in {o}.",
             "{o} is the seat of the {s}.",
             "The headquarters of the {s} is in {o}.",
             "In {o}, the {s} still has its headquarters."),
    "region": ("{s} is a city in the region of {o}.",
               "The cities of {o} include {s}.",
               "In {o}, settlers described {s} as a notable city.",
               "The region {o} has the city of {s}."),
    "founded": ("{s} was founded by settlers in {o}.",
                "The charter of {s} is from {o}.",
                "In {o}, settlers founded the city of {s}.",
                "{s}, a city founded in {o}, still has its charter."),
}
TEACHING_FILLERS = {
    "person": ("Friends described {e} as a notable person.",),
    "city": ("People in {e} still debate its notable institutions.",),
    "region": ("Critics described {e} as a notable region.",),
    "org": ("Critics still debate the notable people of the {e}.",),
    "work": ("Critics still debate the ending of the notable {e}.",),
}
NEWS_STYLES = ("single", "teaching")


def _news_relation(fact: Dict, works) -> str:
  relation = fact["relation"]
  if relation == "year":
    return "work_year" if fact["subject"] in works else "org_year"
  return relation


def generate_news(world: World, seed: int = 0, share: float = 0.5,
                  filler_per_entity: Optional[float] = None, style: str = "single",
                  restatements: int = 4) -> Tuple[List[Dict], Dict]:
  """Dated news items about ``share`` of the world's entities (chosen by ``seed``).

  ``style="single"`` (the default, and the demo's world): every fact whose subject is a
  covered entity is restated once, in :data:`NEWS_TEMPLATES`'s wording (words the encyclopedia
  does not use), in an item of its own; about ``filler_per_entity`` (default 0.5) items per
  covered entity state no fact (:data:`NEWS_FILLERS`).

  ``style="teaching"`` (the tables'): every such fact is restated in ``restatements`` items
  (at most 4), each with another of its relation's :data:`TEACHING_TEMPLATES` (every one with
  two salient spans or more, in the encyclopedia's words); fillers
  (:data:`TEACHING_FILLERS`, ``filler_per_entity`` default 0.1 per covered entity) stay under
  10% of the items.

  An entity not covered is never named in the news. Each item is ``{"title": "<paper>,
  <year>", "text", "date": "YYYY-MM-DD"}``, in a seeded order. Returns the items and the
  coverage record (``covered``, ``never_covered``, ``share``, ``seed``, ``style``).
  """
  if not 0.0 <= share <= 1.0:
    raise ValueError(f"share must be in [0, 1], got {share}")
  if style not in NEWS_STYLES:
    raise ValueError(f"style must be one of {NEWS_STYLES}, got {style!r}")
  if not 1 <= restatements <= 4:
    raise ValueError(f"restatements must be in 1..4 (templates per relation), got "
                     f"{restatements}")
  if filler_per_entity is None:
    filler_per_entity = 0.5 if style == "single" else 0.1
  rng = random.Random(f"news-{seed}")
  kinds = _entity_kinds(world)
  subjects = sorted({f["subject"] for f in world.facts})
  covered = set(rng.sample(subjects, round(share * len(subjects))))
  works = {n for n, k in kinds.items() if k == "work"}
  birthplace = {f["subject"]: f["object"] for f in world.facts if f["relation"] == "born_in"}
  texts = []
  for f in world.facts:
    if f["subject"] not in covered:
      continue
    relation = _news_relation(f, works)
    slots = dict(s=f["subject"], o=f["object"], o_article=_article(f["object"]),
                 city=birthplace.get(f["subject"], ""))
    if style == "single":
      texts.append(NEWS_TEMPLATES[relation].format(**slots))
    else:
      for template in rng.sample(TEACHING_TEMPLATES[relation], restatements):
        texts.append(template.format(**slots))
  fillers = NEWS_FILLERS if style == "single" else TEACHING_FILLERS
  for name in sorted(covered):
    if rng.random() < filler_per_entity:
      texts.append(rng.choice(fillers[kinds.get(name, "city")]).format(e=name))
  rng.shuffle(texts)
  items = []
  for i, text in enumerate(texts):
    year, month, day = rng.randint(1950, 2020), rng.randint(1, 12), rng.randint(1, 28)
    # A short title (a block's title shares its wordpieces with the body); the date in full.
    items.append({"title": f"{_PAPERS[i % len(_PAPERS)]}, {year}",
                  "text": text,
                  "date": f"{year:04d}-{month:02d}-{day:02d}"})
  fact_items = sum(1 for f in world.facts if f["subject"] in covered) * (
      1 if style == "single" else restatements)
  coverage = {"seed": seed, "share": share, "style": style, "covered": sorted(covered),
              "never_covered": sorted(set(subjects) - covered),
              "fact_items": fact_items, "items": len(items)}
  return items, coverage


def build_demo_vocab(texts, output_file: str, vocab_size: int = 3000,
                     lower_case: bool = True, whole_words: Sequence[str] = ()) -> List[str]:
  """Learns the demo's WordPiece vocabulary from article texts (``realm_tf`` ``learn_vocab``).

  ``whole_words`` are appended as single wordpieces (the demo passes ``name_words``).
  """
  vocab = learn_vocab(list(texts), output_file, vocab_size=vocab_size, lower_case=lower_case)
  # The learner keeps only frequent pieces of so small a corpus; adding the name syllables (as
  # word starts and continuations) makes every invented name a handful of wordpieces.
  extra = [p for s in SYLLABLES for p in (s, "##" + s)]
  extra += [w.lower() if lower_case else w for w in whole_words]
  known = set(vocab)
  extra = [p for p in dict.fromkeys(extra) if p not in known]
  if extra:
    vocab = vocab + extra
    tmp = output_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write("\n".join(vocab) + "\n")
    os.replace(tmp, output_file)
  return vocab


def name_words(world: World) -> List[str]:
  """Every word of every name in ``world``, and every year from 1000 to 2099."""
  words = [w for p in world.patterns for w in p["pattern"].split()]
  return words + [str(year) for year in range(1000, 2100)]


def qa_facts(world: World) -> List[Tuple[Dict, Dict]]:
  """``(qa record, the fact it asks)`` pairs: :func:`generate_world` makes ``world.qa[i]`` from
  ``world.facts[i]``, its answer being the fact's object; raises ValueError if they disagree."""
  if len(world.qa) != len(world.facts):
    raise ValueError(f"{len(world.qa)} questions for {len(world.facts)} facts")
  pairs = list(zip(world.qa, world.facts))
  for q, f in pairs:
    if q["answers"] != [f["object"]]:
      raise ValueError(f"question {q['question']!r} does not ask fact {f}")
  return pairs


def qa_split(question: str, dev_fraction: float = 0.1, test_fraction: float = 0.2) -> str:
  """``"train"``, ``"dev"`` or ``"test"`` for one question, by the SHA1 of its text.

  The first 8 bytes of ``sha1(question)`` as a fraction ``u`` of 2**64: test when
  ``u < test_fraction``, dev when ``u < test_fraction + dev_fraction``, else train. The same
  on every run and every machine (unlike Python's ``hash``).
  """
  if not (0.0 <= dev_fraction and 0.0 <= test_fraction and dev_fraction + test_fraction <= 1.0):
    raise ValueError(f"fractions must be >= 0 with a sum <= 1, got dev_fraction={dev_fraction}, "
                     f"test_fraction={test_fraction}")
  u = int.from_bytes(hashlib.sha1(question.encode("utf-8")).digest()[:8], "big") / 2.0**64
  if u < test_fraction:
    return "test"
  return "dev" if u < test_fraction + dev_fraction else "train"


def split_qa(qa_records: Sequence[Dict], dev_fraction: float = 0.1,
             test_fraction: float = 0.2) -> Dict[str, List[int]]:
  """Splits QA records, held out by question: ``{"train", "dev", "test"}`` -> indices.

  Each record goes where :func:`qa_split` sends its question text, so records that share a
  question text always share a split and no test question is asked in training. In a world of
  :func:`generate_world` each fact has one question and each question one fact (a question is
  made of the fact's subject and relation, and a subject has one object per relation), so this
  is also a split by fact: a test question's fact is never asked in training. Hashing the
  question rather than ``subject|relation|object`` keeps that true of any records given.

  Args:
    qa_records: ``{"question", "answers", ...}`` (e.g. ``World.qa``; :func:`qa_facts` pairs
      ``World.qa[i]`` with ``World.facts[i]``).
    dev_fraction: the expected fraction of questions in dev.
    test_fraction: the expected fraction of questions in test.

  Returns:
    Indices into ``qa_records`` of each split, ascending; together they are every index once.
  """
  splits = {"train": [], "dev": [], "test": []}
  for i, record in enumerate(qa_records):
    splits[qa_split(record["question"], dev_fraction, test_fraction)].append(i)
  return splits


def qa_split_records(world: World, dev_fraction: float = 0.1,
                     test_fraction: float = 0.2) -> Dict[str, List[Dict]]:
  """The world's questions by split (:func:`split_qa`), as ``data_prep.open_qa`` writes them:
  ``{"question", "answers", "answer_type": "text"}``."""
  qa = [q for q, _ in qa_facts(world)]
  return {split: [{"question": qa[i]["question"], "answers": list(qa[i]["answers"]),
                   "answer_type": "text"} for i in indices]
          for split, indices in split_qa(qa, dev_fraction, test_fraction).items()}


def write_world(world: World, output_dir: str, vocab_size: Optional[int] = None,
                lower_case: bool = True, whole_word_names: bool = False,
                qa_dev_fraction: float = 0.1, qa_test_fraction: float = 0.2,
                news_seed: int = 0, news_share: float = 0.5,
                news_style: str = "single") -> Dict[str, str]:
  """Writes the world's files into ``output_dir`` atomically; returns their paths.

  The keys: ``articles``, ``qa``, ``qa_train``, ``qa_dev``, ``qa_test``, ``patterns``,
  ``facts``, ``news``, ``news_coverage`` (:func:`generate_news` with ``news_seed``,
  ``news_share`` and ``news_style``) and, with ``vocab_size``, ``vocab``. With ``vocab_size``, also learns
  ``vocab.txt``; ``whole_word_names`` makes every name word and year one wordpiece, so a
  masked name is one token the reader can copy from a block. ``qa_dev_fraction`` and
  ``qa_test_fraction`` are :func:`split_qa`'s.
  """
  names = {"articles": "articles.jsonl", "qa": "qa.jsonl", "qa_train": "qa-train.jsonl",
           "qa_dev": "qa-dev.jsonl", "qa_test": "qa-test.jsonl",
           "patterns": "entity_patterns.jsonl", "facts": "facts.jsonl", "news": "news.jsonl",
           "news_coverage": "news_coverage.json"}
  qa_splits = qa_split_records(world, qa_dev_fraction, qa_test_fraction)
  news, coverage = generate_news(world, news_seed, news_share, style=news_style)
  with beam_utils.atomic_output_dir(output_dir) as tmp:
    for key, rows in (("articles", world.articles), ("qa", world.qa),
                      ("qa_train", qa_splits["train"]), ("qa_dev", qa_splits["dev"]),
                      ("qa_test", qa_splits["test"]),
                      ("patterns", world.patterns), ("facts", world.facts), ("news", news)):
      with open(os.path.join(tmp, names[key]), "w", encoding="utf-8") as f:
        for row in rows:
          f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(os.path.join(tmp, names["news_coverage"]), "w", encoding="utf-8") as f:
      json.dump(coverage, f, indent=1)
    if vocab_size:
      build_demo_vocab([a["title"] + "\n" + a["text"] for a in world.articles] +
                       [q["question"] for q in world.qa] +
                       [n["title"] + "\n" + n["text"] for n in news],
                       os.path.join(tmp, "vocab.txt"),
                       vocab_size, lower_case,
                       whole_words=name_words(world) if whole_word_names else ())
      names["vocab"] = "vocab.txt"
  return {k: os.path.join(output_dir, v) for k, v in names.items()}


def define_flags() -> None:
  """The command line's flags (see :mod:`data_prep.cli`)."""
  flags.DEFINE_string("output_dir", None, "Where the world's files go.")
  flags.DEFINE_integer("seed", 0, "The same seed, the same world.")
  for name, default in (("num_regions", 6), ("num_cities", 30), ("num_people", 100),
                        ("num_organizations", 24), ("num_works", 50)):
    flags.DEFINE_integer(name, default, f"How many {name[len('num_'):]} the world has.",
                         lower_bound=1)
  flags.DEFINE_float("news_share", 0.5, "Share of the entities whose facts the news restates.",
                     lower_bound=0.0, upper_bound=1.0)
  flags.DEFINE_enum("news_style", "single", list(NEWS_STYLES),
                    "single: each fact once, in words of its own; teaching: four times, in the "
                    "encyclopedia's words (the tables').")
  flags.DEFINE_integer("vocab_size", 0,
                       "Also learn a WordPiece vocab.txt of about this size (0: no).",
                       lower_bound=0)
  flags.mark_flag_as_required("output_dir")


def main(argv):
  del argv  # No positional arguments (checked by cli.run).
  f = flags.FLAGS
  world = generate_world(f.seed, f.num_regions, f.num_cities, f.num_people,
                         f.num_organizations, f.num_works)
  paths = write_world(world, f.output_dir, f.vocab_size or None, news_seed=f.seed,
                      news_share=f.news_share, news_style=f.news_style)
  print(json.dumps({"articles": len(world.articles), "qa": len(world.qa),
                    "patterns": len(world.patterns), "facts": len(world.facts), **paths}))


if __name__ == "__main__":
  cli.run(main, define_flags, beam=False)
