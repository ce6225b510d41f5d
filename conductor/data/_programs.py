"""Short programs to trace for the ``mixed`` set (issue #18): "What does this program print?".

Each generator returns a :class:`Program`: the source, and the output computed from the
generator's own parameters by a mirror of the program's logic written here (plain integer and
string arithmetic, never ``exec``/``eval`` of the source). Loading the dataset therefore needs
no subprocess; ``tests/integration/test_dataset_processes.py`` runs the programs through the
isolated sandbox (``conductor.providers.tools.sandbox``) and checks that each printed exactly
``output``.

Programs print one integer or one lower-case word, so the ``math`` and ``text`` verifiers read
them. None is a bare expression the calculator could evaluate from the question's text.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PROGRAMS", "Program"]

_WORDS = (
    "apple",
    "banana",
    "cherry",
    "garden",
    "window",
    "rocket",
    "pencil",
    "planet",
    "river",
    "silver",
    "marble",
    "castle",
)
_FRUITS = ("apple", "pear", "plum", "fig", "kiwi", "lime")


@dataclass(frozen=True)
class Program:
    task: str  # the generator's name, stored in meta["task"]
    source: str
    output: str  # what the program prints, without the trailing newline


def _loop_sum(rng: random.Random) -> Program:
    start, n, step = rng.randint(1, 20), rng.randint(3, 8), rng.randint(2, 9)
    source = f"total = {start}\nfor i in range({n}):\n    total += i * {step}\nprint(total)"
    return Program("loop_sum", source, str(start + step * n * (n - 1) // 2))


def _list_index(rng: random.Random) -> Program:
    xs = rng.sample(range(1, 60), 5)
    extra, k = rng.randint(60, 99), rng.randrange(6)
    ordered = sorted([*xs, extra], reverse=True)
    source = f"xs = {xs}\nxs.append({extra})\nxs.sort(reverse=True)\nprint(xs[{k}])"
    return Program("list_index", source, str(ordered[k]))


def _collatz(rng: random.Random) -> Program:
    start = rng.randint(6, 40)
    n, steps = start, 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    source = (
        f"n = {start}\nsteps = 0\nwhile n != 1:\n"
        "    if n % 2 == 0:\n        n = n // 2\n    else:\n        n = 3 * n + 1\n"
        "    steps += 1\nprint(steps)"
    )
    return Program("collatz", source, str(steps))


def _function_twice(rng: random.Random) -> Program:
    a, b, x = rng.randint(2, 5), rng.randint(1, 9), rng.randint(2, 9)
    source = f"def f(x):\n    return x * {a} - {b}\n\nprint(f(f({x})))"
    return Program("function_twice", source, str((x * a - b) * a - b))


def _branch(rng: random.Random) -> Program:
    x, d = rng.randint(10, 99), rng.choice((2, 3, 5))
    out = x // d if x % d == 0 else x * 2 + 1
    source = f"x = {x}\nif x % {d} == 0:\n    x = x // {d}\nelse:\n    x = x * 2 + 1\nprint(x)"
    return Program("branch", source, str(out))


def _reverse_word(rng: random.Random) -> Program:
    first, second = rng.sample(_WORDS, 2)
    source = f'word = "{first}" + "{second}"\nprint(word[::-1])'
    return Program("reverse_word", source, (first + second)[::-1])


def _count_letter(rng: random.Random) -> Program:
    word = rng.choice(_WORDS)
    letter = rng.choice(sorted(set(word)))
    source = f'word = "{word}"\nprint(word.count("{letter}") * {len(word)})'
    return Program("count_letter", source, str(word.count(letter) * len(word)))


def _dict_lookup(rng: random.Random) -> Program:
    names = rng.sample(_FRUITS, 3)
    prices = {name: rng.randint(2, 12) for name in names}
    a, b = rng.randint(2, 6), rng.randint(2, 6)
    source = (
        f'prices = {prices!r}\nprint(prices["{names[0]}"] * {a} + prices["{names[2]}"] * {b})'
    ).replace("'", '"')
    return Program("dict_lookup", source, str(prices[names[0]] * a + prices[names[2]] * b))


def _max_word(rng: random.Random) -> Program:
    words = rng.sample(_WORDS, 4)
    longest = max(words, key=len)  # first of the longest, as Python's max
    source = f"words = {words!r}\nprint(max(words, key=len))".replace("'", '"')
    return Program("max_word", source, longest)


def _while_double(rng: random.Random) -> Program:
    start, limit = rng.randint(2, 9), rng.randint(50, 500)
    n, count = start, 0
    while n < limit:
        n *= 2
        count += 1
    source = (
        f"n = {start}\ncount = 0\nwhile n < {limit}:\n    n *= 2\n    count += 1\nprint(n + count)"
    )
    return Program("while_double", source, str(n + count))


PROGRAMS: tuple[Callable[[random.Random], Program], ...] = (
    _loop_sum,
    _list_index,
    _collatz,
    _function_twice,
    _branch,
    _reverse_word,
    _count_letter,
    _dict_lookup,
    _max_word,
    _while_double,
)
