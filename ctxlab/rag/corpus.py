"""The retrieval fixture: a seeded corpus of fictional organisations and 100 gold questions.

Every organisation has a profile (founder, year, city, product, director, staff, the
founder's birthplace). Half the profiles have a second, later version in which the
director and the head count changed, and a news item dated between the versions repeats
the old director: a conflict that only the metadata (newest version, newest date)
settles. The founder's birthplace sits paragraphs away from the founder's name, so that
question needs two chunks. Each question names its gold document, answer and evidence
sentences (exact text of the newest version), from which the gold chunks are found after
chunking. Names are made up, so the model cannot know the answers without the passages.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs import loads_json, read_text
from ctxlab.outputs import write_text
from ctxlab.rag.readers import SourceDoc

_SYL = (
    "vel trin os sa mar ro quel dun bri ka tho len gar vi so mel ith ran por cul bes ty "
    "nor al fen dra wik lo cas per ul zan ev"
).split()
_KINDS = {
    "Foundry": ("a foundry", ["brass valves", "cast iron stoves", "bronze bells"]),
    "Observatory": ("a private observatory", ["star charts", "telescope mirrors", "tide tables"]),
    "Shipyard": ("a shipyard", ["river barges", "fishing cutters", "ferry hulls"]),
    "Press": ("a printing house", ["printed maps", "school atlases", "railway timetables"]),
    "Works": ("an engineering works", ["clockwork pumps", "water turbines", "steam winches"]),
    "Cooperative": ("a farming cooperative", ["rye flour", "apple cider", "wool blankets"]),
}
_FILLER = (
    "The {noun} on the {side} side of the main building stores {material}.",
    "Visitors often remark on the {adj} {noun} near the entrance.",
    "A small museum room shows {material} from the early years.",
    "The staff meet every {day} morning to plan the week.",
    "Its archive keeps letters about {material} and the {noun}.",
    "Local schools visit in spring to see the {adj} {noun}.",
)
_WORDS = {
    "noun": ["courtyard", "workshop", "tower", "warehouse", "garden", "reading room", "gallery"],
    "side": ["east", "west", "north", "south"],
    "material": ["copper sheets", "old ledgers", "glass plates", "oak beams", "rope coils"],
    "adj": ["narrow", "painted", "vaulted", "quiet", "tiled", "crooked"],
    "day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"],
}


@dataclass(frozen=True)
class GoldQuestion:
    id: str
    kind: str  # founder | year | city | product | director | staff | birthplace
    question: str
    answer: str
    doc_id: str
    evidence: tuple[str, ...]  # sentences of the newest version that hold the answer
    note: str = ""  # e.g. "versioned: the old director is in v1 and in a news item"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class CorpusFixture:
    docs: list[SourceDoc]  # oldest first, so versions ingest in order
    questions: list[GoldQuestion]
    seed: int

    def write(self, folder: Path) -> Path:
        """One Markdown file per document version (front matter: doc_id, title, date) and
        questions.jsonl; returns the folder of documents."""
        docs = folder / "docs"
        docs.mkdir(parents=True, exist_ok=True)
        for d in self.docs:  # whole or absent, a full disk named (ctxlab.outputs)
            write_text(
                docs / f"{Path(d.source).name}",
                f"---\ndoc_id: {d.doc_id}\ntitle: {d.title}\ndate: {d.date}\n---\n{d.text}\n",
            )
        lines = "".join(json.dumps(q.as_dict()) + "\n" for q in self.questions)
        write_text(folder / "questions.jsonl", lines)
        return docs


@dataclass
class _Org:
    name: str
    slug: str
    kind: str
    founder: str
    year: int
    city: str
    product: str
    birthplace: str
    director: list[str]
    staff: list[int]
    dates: list[str]


def _word(rng: random.Random, used: set[str], parts: int) -> str:
    for _ in range(1000):
        w = "".join(rng.choice(_SYL) for _ in range(parts)).capitalize()
        if w not in used:
            used.add(w)
            return w
    raise RuntimeError("ran out of names")  # pragma: no cover


def _filler(rng: random.Random, n: int) -> str:
    return " ".join(
        t.format(**{k: rng.choice(v) for k, v in _WORDS.items()}) for t in rng.sample(_FILLER, n)
    )


def _orgs(rng: random.Random, count: int) -> list[_Org]:
    used: set[str] = set()
    cities = [_word(rng, used, 3) for _ in range(count // 2)]
    towns = [_word(rng, used, 2) + "by" for _ in range(count // 2)]
    kinds = list(_KINDS)
    orgs = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        name = f"{_word(rng, used, 2)} {kind}"
        person = lambda: f"{_word(rng, used, 2)} {_word(rng, used, 2)}"  # noqa: E731
        versioned = i % 2 == 0
        month, day = rng.randint(1, 12), rng.randint(1, 28)
        dates = [f"2019-{month:02d}-{day:02d}"]
        directors, staff = [person()], [rng.randint(12, 900)]
        if versioned:
            dates.append(f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
            directors.append(person())
            staff.append(staff[0] + rng.randint(5, 200))
        orgs.append(
            _Org(
                name=name,
                slug=name.lower().replace(" ", "-"),
                kind=kind,
                founder=person(),
                year=rng.randint(1850, 1990),
                city=rng.choice(cities),
                product=rng.choice(_KINDS[kind][1]),
                birthplace=rng.choice(towns),
                director=directors,
                staff=staff,
                dates=dates,
            )
        )
    return orgs


def _sentences(o: _Org, v: int) -> dict[str, str]:
    return {
        "city": f"{o.name} is {_KINDS[o.kind][0]} based in {o.city}.",
        "founder": f"{o.name} was founded in {o.year} by {o.founder}.",
        "product": f"The main product of {o.name} is {o.product}.",
        "director": f"The director of {o.name} is {o.director[v]}.",
        "staff": f"{o.name} employs {o.staff[v]} people.",
        "birthplace": f"Its founder, {o.founder}, was born in {o.birthplace}.",
    }


def _profile(o: _Org, v: int, rng: random.Random) -> str:
    s = _sentences(o, v)
    revised = f" This profile was revised on {o.dates[v]}." if v > 0 else ""
    paragraphs = [
        f"# {o.name}\n\n{s['city']} {_filler(rng, 2)}",
        f"{s['founder']} {_filler(rng, 1)}",
        f"{s['product']} {_filler(rng, 2)}",
        f"{s['director']} {s['staff']}{revised} {_filler(rng, 1)}",
        f"## History\n\n{_filler(rng, 3)}",
        f"{s['birthplace']} {_filler(rng, 2)}",
    ]
    return "\n\n".join(paragraphs)


def corpus_fixture(seed: int = 0, organisations: int = 24, questions: int = 100) -> CorpusFixture:
    """The seeded corpus and its gold questions (same seed, same corpus)."""
    if organisations < 6 or organisations % 2:
        raise CtxlabError("the corpus needs an even number of at least 6 organisations.")
    rng = random.Random(seed)
    orgs = _orgs(rng, organisations)
    docs: list[SourceDoc] = []
    for o in orgs:
        for v, day in enumerate(o.dates):
            docs.append(
                SourceDoc(
                    f"profile-{o.slug}",
                    _profile(o, v, rng),
                    day,
                    o.name,
                    f"profile-{o.slug}.v{v + 1}.md",
                )
            )
        if len(o.dates) > 1:
            day = f"2021-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
            text = (
                f"# {o.name} names its director\n\n{o.director[0]} will stay on as director "
                f"of {o.name}, the board said on {day}. {o.name} now employs {o.staff[0]} "
                f"people. {_filler(rng, 2)}"
            )
            docs.append(
                SourceDoc(f"news-{o.slug}-2021", text, day, f"{o.name} news", f"news-{o.slug}.md")
            )
    pool = _question_pool(orgs)
    picked = _stratified(pool, questions, rng)
    return CorpusFixture(sorted(docs, key=lambda d: (d.date, d.source)), picked, seed)


_QUOTA = {
    "director": 20,
    "staff": 12,
    "birthplace": 16,
    "founder": 14,
    "year": 14,
    "city": 12,
    "product": 12,
}


def _question_pool(orgs: list[_Org]) -> dict[str, list[GoldQuestion]]:
    pool: dict[str, list[GoldQuestion]] = {k: [] for k in _QUOTA}
    for o in orgs:
        v = len(o.dates) - 1
        s = _sentences(o, v)
        doc = f"profile-{o.slug}"
        versioned = "versioned: v1 and a 2021 news item give the old value" if v else ""
        by = s["founder"]
        items = [
            ("founder", f"Who founded {o.name}?", o.founder, (by,), ""),
            ("year", f"In which year was {o.name} founded?", str(o.year), (by,), ""),
            ("city", f"In which city is {o.name} based?", o.city, (s["city"],), ""),
            ("product", f"What is the main product of {o.name}?", o.product, (s["product"],), ""),
            (
                "director",
                f"Who is the director of {o.name}?",
                o.director[v],
                (s["director"],),
                versioned,
            ),
            (
                "staff",
                f"How many people does {o.name} employ?",
                str(o.staff[v]),
                (s["staff"],),
                versioned,
            ),
            (
                "birthplace",
                f"In which town was the founder of {o.name} born?",
                o.birthplace,
                (by, s["birthplace"]),
                "split: the founder's name and birthplace are chunks apart",
            ),
        ]
        for kind, q, a, ev, note in items:
            pool[kind].append(GoldQuestion("", kind, q, a, doc, ev, note))
    return pool


def _stratified(
    pool: dict[str, list[GoldQuestion]], total: int, rng: random.Random
) -> list[GoldQuestion]:
    scale = total / sum(_QUOTA.values())
    quota = {k: round(n * scale) for k, n in _QUOTA.items()}
    quota["director"] += total - sum(quota.values())
    out: list[GoldQuestion] = []
    for kind, n in quota.items():
        candidates = pool[kind]
        if kind in ("director", "staff"):  # every versioned conflict first
            candidates = sorted(candidates, key=lambda q: (not q.note, q.doc_id))
            chosen = candidates[:n]
        else:
            chosen = rng.sample(candidates, min(n, len(candidates)))
        out += chosen
    rng.shuffle(out)  # kinds interleaved, so any first n questions are a mixed sample
    return [
        GoldQuestion(f"q{i:03d}", q.kind, q.question, q.answer, q.doc_id, q.evidence, q.note)
        for i, q in enumerate(out)
    ]


def read_questions(path: Path) -> list[GoldQuestion]:
    """questions.jsonl as written by `CorpusFixture.write`."""
    if not path.is_file():
        raise CtxlabError(f"questions file {path} does not exist.")
    out = []
    for n, line in enumerate(read_text(path, "questions file").splitlines(), 1):
        if not line.strip():
            continue
        item = loads_json(line, f"line {n} of {path}")
        try:
            out.append(
                GoldQuestion(
                    str(item["id"]),
                    str(item.get("kind", "")),
                    str(item["question"]),
                    str(item["answer"]),
                    str(item["doc_id"]),
                    tuple(item["evidence"]),
                    str(item.get("note", "")),
                )
            )
        except (KeyError, TypeError):
            raise CtxlabError(
                f"line {n} of {path} needs id, question, answer, doc_id and evidence."
            ) from None
    if not out:
        raise CtxlabError(f"questions file {path} holds no questions.")
    return out
