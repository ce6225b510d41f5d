"""Knowledge and word questions of the ``mixed`` set (issue #18), kept here (no downloads).

Each topic is a set of facts ``(subject, reference)`` and question templates. The ``test``
split asks with the first template, the phrasing the topic was measured with; ``train`` cycles
through all of them. References may hold aliases separated by ``|`` (``verify_text``).

Topics were kept by measurement, not by assumption: SmolLM2-135M-Instruct (``single:smol``,
greedy) on every fact of a topic with its first template, scored by ``verify_text``; a topic
stays if it gets >= 80 %. Measured on 2026-12-02, 10 questions each with the first template:
kept opposites 9/10, plurals 9/10, currencies 9/10, capitals 7/10 (kept: measured 10/10 in
issue #18, and here it answers France, Italy and Spain in their own language; the embedded
pool's ``system: Answer in English.`` fixes France, see docs/evaluation.md for the split's
numbers); rejected past tense of irregular verbs 1/10 ("the
past tense of see is see"), baby animals 0/10, languages 1/10, colours 1/10, continents 1/10,
the day or month after 0/10.
Facts whose answer repeats the subject ("the plural of sheep") are left out: the echo of the
question would pass for an answer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TOPICS", "Topic"]


@dataclass(frozen=True)
class Topic:
    name: str
    templates: tuple[str, ...]  # "{}" is the subject; [0] is the measured phrasing
    facts: tuple[tuple[str, str], ...]


CAPITALS = Topic(
    "capital",
    (
        "What is the capital city of {}?",
        "Which city is the capital of {}?",
        "Name the capital of {}.",
        "Tell me which city is the capital of {}.",
        "{}: name its capital city.",
    ),
    (
        ("Japan", "Tokyo"),
        ("Germany", "Berlin"),
        ("Russia", "Moscow"),
        ("Canada", "Ottawa"),
        ("Egypt", "Cairo"),
        ("Norway", "Oslo"),
        ("Greece", "Athens"),
        ("Sweden", "Stockholm"),
        ("Finland", "Helsinki"),
        ("Denmark", "Copenhagen"),
        ("Poland", "Warsaw"),
        ("Austria", "Vienna"),
        ("Portugal", "Lisbon"),
        ("Ireland", "Dublin"),
        ("Hungary", "Budapest"),
        ("Kenya", "Nairobi"),
        ("Peru", "Lima"),
        ("Chile", "Santiago"),
        ("Argentina", "Buenos Aires"),
        ("Thailand", "Bangkok"),
        ("China", "Beijing|Peking"),
        ("South Korea", "Seoul"),
        ("Cuba", "Havana"),
        ("Belgium", "Brussels"),
        ("the Netherlands", "Amsterdam"),
        ("Iran", "Tehran|Teheran"),
        ("Iraq", "Baghdad"),
        ("Indonesia", "Jakarta"),
        ("Vietnam", "Hanoi"),
        ("the Philippines", "Manila"),
        ("Turkey", "Ankara"),
        ("Australia", "Canberra"),
        ("the Czech Republic", "Prague"),
        ("France", "Paris"),
        ("Italy", "Rome"),
        ("Spain", "Madrid"),
    ),
)

OPPOSITES = Topic(
    "opposite",
    (
        "What is the opposite of {}?",
        "What word means the opposite of {}?",
        'Give the opposite of the word "{}".',
        "Name a word opposite in meaning to {}.",
        "{}: what is its opposite?",
    ),
    (
        ("hot", "cold"),
        ("up", "down"),
        ("big", "small|little"),
        ("fast", "slow"),
        ("happy", "sad|unhappy"),
        ("open", "closed|close|shut"),
        ("early", "late"),
        ("full", "empty"),
        ("wet", "dry"),
        ("tall", "short"),
        ("old", "young|new"),
        ("day", "night"),
        ("black", "white"),
        ("good", "bad|evil"),
        ("rich", "poor"),
        ("strong", "weak"),
        ("thick", "thin"),
        ("high", "low"),
        ("left", "right"),
        ("push", "pull"),
        ("win", "lose"),
        ("love", "hate"),
        ("inside", "outside"),
        ("top", "bottom"),
        ("north", "south"),
        ("east", "west"),
        ("buy", "sell"),
        ("alive", "dead"),
        ("clean", "dirty"),
        ("true", "false"),
        ("light", "dark|heavy"),
        ("hard", "soft|easy"),
    ),
)

PLURALS = Topic(
    "plural",
    (
        "What is the plural of {}?",
        'What is the plural form of the word "{}"?',
        'Give the plural of "{}".',
        "Write the plural of {}.",
        "{}: what is its plural?",
    ),
    (
        ("mouse", "mice"),
        ("child", "children"),
        ("foot", "feet"),
        ("tooth", "teeth"),
        ("man", "men"),
        ("woman", "women"),
        ("goose", "geese"),
        ("box", "boxes"),
        ("city", "cities"),
        ("knife", "knives"),
        ("person", "people|persons"),
        ("leaf", "leaves"),
        ("wolf", "wolves"),
        ("baby", "babies"),
        ("dish", "dishes"),
        ("fox", "foxes"),
        ("church", "churches"),
        ("potato", "potatoes"),
        ("hero", "heroes"),
        ("ox", "oxen"),
        ("cactus", "cacti|cactuses"),
        ("wife", "wives"),
        ("life", "lives"),
        ("half", "halves"),
        ("story", "stories"),
        ("lady", "ladies"),
        ("glass", "glasses"),
        ("watch", "watches"),
        ("bus", "buses|busses"),
        ("party", "parties"),
    ),
)

CURRENCIES = Topic(
    "currency",
    (
        "What is the currency of {}?",
        "Which currency is used in {}?",
        "Name the money used in {}.",
        "What currency do they use in {}?",
        "{}: which currency do people pay with?",
    ),
    (
        ("Japan", "yen"),
        ("the United Kingdom", "pound|pound sterling|pounds"),
        ("the United States", "dollar|dollars"),
        ("India", "rupee|rupees"),
        ("Russia", "ruble|rouble|rubles"),
        ("China", "yuan|renminbi"),
        ("Mexico", "peso|pesos"),
        ("Switzerland", "franc|francs"),
        ("South Korea", "won"),
        ("Germany", "euro|euros"),
        ("France", "euro|euros"),
        ("Italy", "euro|euros"),
        ("Spain", "euro|euros"),
        ("Brazil", "real|reais"),
        ("South Africa", "rand"),
        ("Thailand", "baht"),
        ("Turkey", "lira|turkish lira"),
        ("Poland", "zloty|z\u0142oty"),
        ("Sweden", "krona|kronor"),
        ("Norway", "krone|kroner"),
        ("Denmark", "krone|kroner"),
        ("Israel", "shekel|new shekel|shekels"),
        ("Vietnam", "dong"),
        ("Indonesia", "rupiah"),
        ("Canada", "dollar|dollars"),
        ("Australia", "dollar|dollars"),
        ("Egypt", "pound|pounds"),
        ("Saudi Arabia", "riyal|riyals"),
    ),
)

TOPICS: tuple[Topic, ...] = (CAPITALS, OPPOSITES, PLURALS, CURRENCIES)
