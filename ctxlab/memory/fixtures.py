"""A multi-session conversation with planted facts, generated from a seed.

A user talks to an assistant over several dated sessions. Among small talk, the user states
facts (a locker code, a pet's name, a flight number...) that a later question asks for;
one fact is updated in a later session, so only its newest value is correct. Each fact
records the index of the message that states its current value: the message a search must
find for the fact to count as recoverable. Same seed, same conversation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_json
from ctxlab.memory.messages import Message, read_history, write_history
from ctxlab.outputs import write_text

_SYLLABLES = (
    "ka ren tho mi sal vek or lin dra pe mo sti ul bar nes qui fal zor hem ta wyn cor "
    "bel ris ton ga mel ro vin sha dul ker"
).split()


@dataclass(frozen=True)
class Fact:
    """A planted fact: its question, its answer, and the message that states it."""

    id: str
    question: str
    answer: str
    message: int  # index in the history of the message stating the current value
    superseded: tuple[int, ...] = ()  # messages stating an older value

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class ConversationFixture:
    history: list[Message]
    facts: list[Fact]
    seed: int

    def write(self, folder: Path) -> tuple[Path, Path]:
        """history.jsonl and facts.json in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        history, facts = folder / "history.jsonl", folder / "facts.json"
        write_history(self.history, history)
        write_text(facts, json.dumps([f.as_dict() for f in self.facts], indent=1) + "\n")
        return history, facts


def _name(rng: random.Random, parts: int = 2) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _fact_templates(rng: random.Random) -> list[tuple[str, str, str, str]]:
    """(id, statement, question, answer) per fact kind, values drawn from `rng`."""
    code = f"{rng.randint(1000, 9999)}"
    cat = _name(rng)
    sister, town = _name(rng), _name(rng, 3)
    colour = rng.choice(["blue", "amber", "quiet", "silver", "rapid"])
    wifi = f"{colour}{_name(rng).lower()}{rng.randint(10, 99)}"
    day = rng.randint(3, 27)
    month = rng.choice(["March", "April", "May", "June", "July"])
    tea = rng.choice(["lapsang souchong", "rooibos", "genmaicha", "earl grey", "sencha"])
    plate = (
        f"{rng.choice('BDFGKLMNPRSTVWXZ')}{rng.choice('BDFGKLMNPRSTVWXZ')}-{rng.randint(100, 999)}"
    )
    flight = f"{rng.choice(['QX', 'LV', 'TR', 'BN'])}{rng.randint(1000, 9999)}"
    project = _name(rng, 3)
    allergy = rng.choice(["hazelnuts", "penicillin", "bee stings", "sesame", "shellfish"])
    dog = _name(rng)
    return [
        (
            "locker",
            f"By the way, my gym locker code is {code}.",
            "What is my gym locker code?",
            code,
        ),
        ("cat", f"Our new cat is called {cat}.", "What is our cat called?", cat),
        (
            "sister",
            f"My sister {sister} just moved to {town}.",
            "Which town did my sister move to?",
            town,
        ),
        (
            "wifi",
            f"The wifi password at the cabin is {wifi}.",
            "What is the wifi password at the cabin?",
            wifi,
        ),
        (
            "dentist",
            f"My dentist appointment is on {day} {month}.",
            "On which date is my dentist appointment?",
            f"{day} {month}",
        ),
        ("tea", f"My favourite tea is {tea}.", "What is my favourite tea?", tea),
        ("plate", f"My car's number plate is {plate}.", "What is my car's number plate?", plate),
        ("flight", f"My flight next month is {flight}.", "What is my flight number?", flight),
        (
            "project",
            f"The project I lead at work is codenamed {project}.",
            "What is the codename of the project I lead at work?",
            project,
        ),
        ("allergy", f"I am allergic to {allergy}.", "What am I allergic to?", allergy),
        ("dog", f"My neighbour's dog is named {dog}.", "What is my neighbour's dog named?", dog),
    ]


_USER_SMALL_TALK = (
    "Can you suggest a good way to keep {thing} fresh for longer?",
    "What is a simple recipe that uses {thing}?",
    "I keep forgetting to water the {thing}; any tips?",
    "How long should I spend on {thing} each week?",
    "Is it worth buying a second-hand {thing}?",
    "What should I pack for a weekend trip with a {thing}?",
    "How do I explain {thing} to a ten-year-old?",
    "Any ideas for a quiet evening that involves {thing}?",
)
_THINGS = (
    "basil",
    "bread",
    "bicycle",
    "guitar practice",
    "sourdough",
    "houseplants",
    "tomatoes",
    "stretching",
    "a tent",
    "chess",
    "coffee beans",
    "watercolours",
    "a kayak",
    "rice",
    "journaling",
    "a sewing machine",
    "lemons",
    "board games",
    "running shoes",
    "tea lights",
)
_ASSISTANT_SENTENCES = (
    "A good place to start is to keep things simple and consistent.",
    "Many people find that a short routine works better than an ambitious plan.",
    "Try a small experiment this week and see what feels natural.",
    "Storing it somewhere cool and dry usually helps a lot.",
    "If you are unsure, ask someone who has done it for a while.",
    "Write down what worked, so next time is easier.",
    "It also helps to set a reminder on your phone.",
    "Quality matters more than quantity here.",
    "Give it two or three weeks before you judge the result.",
    "A little preparation the evening before saves time in the morning.",
    "You can always adjust the plan once you see how it goes.",
    "Keeping a spare nearby avoids a last-minute rush.",
)


def conversation_fixture(
    seed: int = 0, sessions: int = 6, turns_per_session: int = 9, facts: int = 10
) -> ConversationFixture:
    """Sessions of small talk with `facts` planted user facts (one updated later)."""
    if sessions < 2 or turns_per_session < 3:
        raise CtxlabError("a conversation fixture needs at least 2 sessions of 3 turns.")
    rng = random.Random(seed)
    kinds = _fact_templates(rng)
    if not 1 <= facts <= len(kinds):
        raise CtxlabError(f"the fixture plants between 1 and {len(kinds)} facts, not {facts}.")
    chosen = rng.sample(kinds, facts)
    slots = [(s, t) for s in range(sessions - 1) for t in range(turns_per_session)]
    planted = dict(zip(sorted(rng.sample(slots, facts)), chosen, strict=True))
    updated_kind = chosen[0]
    update_slot = (sessions - 1, rng.randrange(turns_per_session - 1))
    new_value = _updated_value(updated_kind, rng)

    history: list[Message] = []
    where: dict[str, int] = {}
    superseded: dict[str, tuple[int, ...]] = {}
    start = datetime(2024, 3, 4, 9, 0)
    for s in range(sessions):
        when = start + timedelta(days=7 * s)
        for t in range(turns_per_session):
            thing = rng.choice(_THINGS)
            question = rng.choice(_USER_SMALL_TALK).format(thing=thing)
            user_text = question
            fact = planted.get((s, t))
            if fact is not None:
                user_text = f"{fact[1]} {question}"
            if (s, t) == update_slot:
                user_text = f"{_update_statement(updated_kind, new_value)} {question}"
            stamp = (when + timedelta(minutes=3 * t)).isoformat()
            history.append(Message("user", user_text, f"session-{s + 1}", stamp))
            if fact is not None:
                where[fact[0]] = len(history) - 1
            if (s, t) == update_slot:
                superseded[updated_kind[0]] = (where[updated_kind[0]],)
                where[updated_kind[0]] = len(history) - 1
            reply = " ".join(rng.sample(_ASSISTANT_SENTENCES, rng.randint(2, 4)))
            stamp = (when + timedelta(minutes=3 * t + 1)).isoformat()
            history.append(Message("assistant", reply, f"session-{s + 1}", stamp))
    out = []
    for kind in chosen:
        answer = new_value if kind is updated_kind else kind[3]
        out.append(Fact(kind[0], kind[2], answer, where[kind[0]], superseded.get(kind[0], ())))
    return ConversationFixture(history, out, seed)


def _updated_value(kind: tuple[str, str, str, str], rng: random.Random) -> str:
    old = kind[3]
    for _ in range(100):
        fresh = _fact_templates(rng)
        value = next(v for k, _, _, v in fresh if k == kind[0])
        if value != old:
            return value
    raise RuntimeError("could not draw a new value")  # pragma: no cover


def _update_statement(kind: tuple[str, str, str, str], value: str) -> str:
    statement = kind[1].removeprefix("By the way, ")
    statement = statement[0].lower() + statement[1:]
    return "A correction to what I said before: " + statement.replace(kind[3], value)


def read_facts(path: Path, history: Sequence[Message]) -> list[Fact]:
    """A facts file: a JSON list of {id, question, answer, message[, superseded]}."""
    if not path.is_file():
        raise CtxlabError(f"facts file {path} does not exist.")
    items = load_json(path, "facts file")
    if not isinstance(items, list) or not items:
        raise CtxlabError(f"facts file {path} must hold a non-empty JSON list of facts.")
    facts = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not {"question", "answer", "message"} <= item.keys():
            raise CtxlabError(f"fact {i} of {path} needs question, answer and message.")
        index = item["message"]
        if not isinstance(index, int) or not 0 <= index < len(history):
            raise CtxlabError(
                f"fact {i} of {path} points at message {index!r}, but the history has "
                f"{len(history)} messages (0-based)."
            )
        facts.append(
            Fact(
                str(item.get("id", i)),
                str(item["question"]),
                str(item["answer"]),
                index,
                tuple(int(x) for x in item.get("superseded", ())),
            )
        )
    return facts


def load_fixture_files(history: Path, facts: Path) -> tuple[list[Message], list[Fact]]:
    messages = read_history(history)
    return messages, read_facts(facts, messages)
