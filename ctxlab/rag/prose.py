"""A second retrieval corpus of real prose: the opening of Coriolanus, with 32 questions.

The seeded fixture (`corpus.py`) is generated text with made-up names: a retriever tuned on
it alone may only have learned its templates. This corpus is real, public-domain text
(Shakespeare, from the tinyshakespeare file the package ships), cut at speech boundaries
into parts of about 4,000 characters, with 32 hand-written questions. Most questions are
reworded (they do not repeat the line's words), so they test more than word overlap. Each
names its answer and an evidence phrase (exact text of one line); the question's document
is the part that holds the evidence. Answers are for retrieval only: the default model
does not know this play well enough for task accuracy to mean much.
"""

from __future__ import annotations

from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.memory.scoring import normalize
from ctxlab.rag.corpus import CorpusFixture, GoldQuestion
from ctxlab.rag.readers import SourceDoc

SOURCE = Path(__file__).parents[1] / "data" / "tinyshakespeare.txt"
CHARS = 60_000  # the opening of Coriolanus (act 1 and the start of act 2)
PART_CHARS = 4_000
DATE = "1623-11-08"  # the First Folio

# (question, answer, evidence phrase)
QUESTIONS: tuple[tuple[str, str, str], ...] = (
    ("How many tribunes were the people granted?", "Five", "Five tribunes to defend their"),
    ("Name one of the tribunes the people chose.", "Junius Brutus", "one's Junius Brutus"),
    ("What news does the messenger bring about the Volsces?", "in arms", "the Volsces are in arms"),
    ("Who leads the enemy army?", "Tullus Aufidius", "Tullus Aufidius, that will put you to"),
    ("Whom must Marcius attend in the coming war?", "Cominius", "Attend upon Cominius"),
    ("Which town do the enemy senators say they will defend?", "Corioli", "guard Corioli"),
    (
        "What insect did the little boy chase and tear?",
        "butterfly",
        "butterfly: and when he caught",
    ),
    ("Which lady comes to call on Virgilia?", "Valeria", "the Lady Valeria is come to visit"),
    ("From whom does Virgilia ask heaven to protect her husband?", "Aufidius", "my lord from fell"),
    ("What did Lartius stake on whether the armies had met?", "horse", "My horse to yours, no."),
    ("What share of the spoils is Marcius offered?", "tenth", "We render you the tenth"),
    (
        "What name is Caius Marcius given for his deeds at the town?",
        "Coriolanus",
        "CORIOLANUS! Bear",
    ),
    ("Whose release does Coriolanus beg from the general?", "his poor host", "poor host freedom"),
    ("Why can Coriolanus not say the prisoner's name?", "forgot", "By Jupiter! forgot."),
    ("What drink does the weary Coriolanus ask for?", "wine", "Have we no wine here?"),
    ("How often has he come home crowned with oak leaves?", "third time", "the third time home"),
    ("According to the letter, who escaped from the fight?", "Aufidius", "Aufidius got off."),
    ("In the fable, which organ do the other limbs revolt against?", "belly", "against the belly"),
    ("Whom do the citizens name the people's chief enemy?", "Caius Marcius", "is chief enemy to"),
    ("What would the people get cheaply by killing him?", "corn", "corn at our own price"),
    ("Which nobleman has always loved the people?", "Menenius Agrippa", "Menenius Agrippa; one"),
    ("Who causes the famine, in Menenius' view?", "the gods", "The gods, not the patricians"),
    ("In the fable, who plays the part of the stomach?", "senators", "The senators of Rome are"),
    ("Whom does Marcius call rats to be sent to the enemy's grain?", "Volsces", "much corn; take"),
    ("Who holds the captured town in Rome's name?", "Titus Lartius", "Holding Corioli in the name"),
    ("To what hunting dog is Lartius compared?", "greyhound", "like a fawning greyhound"),
    (
        "How long did Marcius fight alone inside the walls?",
        "three hours",
        "Within these three hours",
    ),
    ("What did the townsmen who sallied out give Lartius and Marcius?", "battle", "Marcius battle"),
    (
        "Where will Marcius beat the enemy leader's head, says his mother?",
        "below his knee",
        "head below his knee",
    ),
    (
        "Which Trojan hero's nursing mother does Volumnia recall?",
        "Hector",
        "When she did suckle Hector",
    ),
    (
        "What does one who trusts the crowd's favour swim with?",
        "fins of lead",
        "swims with fins of lead",
    ),
    (
        "Who is the general leading part of the Roman power?",
        "Cominius",
        "whom Cominius the general",
    ),
)


def _parts(text: str) -> list[str]:
    """Cut at blank lines (between speeches) into parts of about PART_CHARS characters."""
    parts, current = [], ""
    for speech in text.split("\n\n"):
        if current and len(current) + len(speech) > PART_CHARS:
            parts.append(current)
            current = ""
        current = f"{current}\n\n{speech}" if current else speech
    if current.strip():
        parts.append(current)
    return parts


def prose_corpus(source: Path = SOURCE) -> CorpusFixture:
    """The Coriolanus corpus and its questions (ids p00..p31)."""
    if not source.is_file():
        raise CtxlabError(f"the prose corpus needs {source}, which is missing.")
    text = source.read_text(encoding="utf-8")[:CHARS]
    text = text[: text.rfind("\n\n")]  # end between speeches
    docs = [
        SourceDoc(f"coriolanus-{i:02d}", part, DATE, f"Coriolanus, part {i + 1}", str(source))
        for i, part in enumerate(_parts(text))
    ]
    questions = []
    for n, (question, answer, evidence) in enumerate(QUESTIONS):
        want = normalize(evidence)
        doc = next((d for d in docs if want in normalize(d.text)), None)
        if doc is None:
            raise CtxlabError(f"prose question {n}: no part holds its evidence {evidence!r}.")
        questions.append(
            GoldQuestion(f"p{n:02d}", "coriolanus", question, answer, doc.doc_id, (evidence,))
        )
    return CorpusFixture(docs, questions, seed=-1)
