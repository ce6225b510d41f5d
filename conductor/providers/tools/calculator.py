"""The calculator tool (issue #3): safe arithmetic over Python's ``ast``, never ``eval``.

``evaluate`` parses in ``"eval"`` mode and walks the tree itself, with an allow-list: int and
float literals, ``+ - * / // % **``, unary ``+``/``-`` and a few functions. Integer division
(``/``) is exact (a ``Fraction``), so ``10 / 4 * 2`` prints ``5``. Size limits keep every call
fast: a hostile ``9**9**9`` is refused before any work, not after a minute of CPU.

``extract_expression`` pulls the expression out of a worker's instruction
("What is 3 * (4 + 5)?" -> ``3 * (4 + 5)``).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from fractions import Fraction

from prefect_conductor.conductor.providers.tools import ToolError

__all__ = ["evaluate", "extract_expression", "format_number"]

Number = int | float | Fraction

MAX_CHARS = 1000
MAX_NODES = 200  # expression nodes (operands, operators, calls), not contexts or op tokens
MAX_EXPONENT = 1000
MAX_POWER_DIGITS = 10_000
MAX_INT = 10**4000
_LOG10_2 = math.log10(2)


def _fail(message: str) -> ToolError:
    return ToolError(f"calculator: {message}")


def _digits(value: int | Fraction) -> int:
    """About how many decimal digits the larger of numerator and denominator has."""
    if isinstance(value, Fraction):
        return max(_digits(value.numerator), _digits(value.denominator))
    return int(abs(value).bit_length() * _LOG10_2) + 1


def _checked(value: object) -> Number:
    if isinstance(value, complex):
        raise _fail("result is not a real number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _fail("result is too large for a float")
        return value
    if isinstance(value, int | Fraction) and not isinstance(value, bool):
        if max(abs(value.numerator), value.denominator) > MAX_INT:
            raise _fail("intermediate result has more than 4000 digits")
        return value
    raise _fail(f"unsupported value of type {type(value).__name__}")


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        exponent = exponent.numerator
    if abs(exponent) > MAX_EXPONENT:
        raise _fail(f"exponent {format_number(exponent)} is too large (limit {MAX_EXPONENT})")
    if isinstance(exponent, int) and not isinstance(base, float):
        digits = _digits(base) * abs(exponent)
        if digits > MAX_POWER_DIGITS:
            raise _fail(f"power would have about {digits} digits (limit {MAX_POWER_DIGITS})")
        return Fraction(base) ** exponent if exponent < 0 else base**exponent
    return float(base) ** float(exponent)


def _divide(a: Number, b: Number) -> Number:
    if isinstance(a, int | Fraction) and isinstance(b, int | Fraction):
        return Fraction(a) / Fraction(b)
    return a / b


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise _fail("sqrt of a negative number")
    if isinstance(x, int | Fraction):
        f = Fraction(x)
        num, den = math.isqrt(f.numerator), math.isqrt(f.denominator)
        if num * num == f.numerator and den * den == f.denominator:
            return Fraction(num, den)  # exact for perfect squares, however large
    return math.sqrt(x)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int) or abs(ndigits) > 100:
        raise _fail("round() takes a whole number of digits between -100 and 100")
    return round(x, ndigits)


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: _divide,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: _power,
}
_SYMBOLS = {ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<"}
_SYMBOLS |= {ast.RShift: ">>", ast.MatMult: "@", ast.Invert: "~", ast.Not: "not"}
# name -> (function, fewest arguments, most arguments)
_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (lambda *a: min(a), 1, 50),
    "max": (lambda *a: max(a), 1, 50),
    "sqrt": (_sqrt, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
}
_REFUSED: tuple[tuple[tuple[type[ast.AST], ...], str], ...] = (
    ((ast.Attribute,), "attribute access is"),
    ((ast.Subscript,), "subscripts are"),
    ((ast.Lambda,), "lambdas are"),
    ((ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp), "comprehensions are"),
    ((ast.Tuple, ast.List, ast.Set, ast.Dict), "collections are"),
    ((ast.Compare,), "comparisons are"),
    ((ast.BoolOp,), "'and'/'or' are"),
    ((ast.IfExp,), "conditional expressions are"),
    ((ast.NamedExpr,), "assignments are"),
    ((ast.JoinedStr,), "strings are"),
)


def _snippet(node: ast.AST, source: str) -> str:
    text = ast.get_source_segment(source, node) or type(node).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _eval(node: ast.AST, source: str) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) in (int, float):
            return _checked(value)
        if isinstance(value, str | bytes):
            raise _fail(f"strings are not allowed ({_snippet(node, source)})")
        raise _fail(f"only int and float numbers are allowed ({_snippet(node, source)})")
    if isinstance(node, ast.BinOp):
        op = _BINARY.get(type(node.op))
        if op is None:
            hint = " (use ** for powers)" if isinstance(node.op, ast.BitXor) else ""
            raise _fail(f"operator {_SYMBOLS.get(type(node.op), '?')!r} is not allowed{hint}")
        left, right = _eval(node.left, source), _eval(node.right, source)
        return _checked(op(left, right))
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub):
            return _checked(-_eval(node.operand, source))
        if isinstance(node.op, ast.UAdd):
            return _checked(+_eval(node.operand, source))
        raise _fail(f"operator {_SYMBOLS.get(type(node.op), '?')!r} is not allowed")
    if isinstance(node, ast.Call):
        return _call(node, source)
    if isinstance(node, ast.Name):
        raise _fail(f"names are not allowed ({node.id!r})")
    what = next((w for types, w in _REFUSED if isinstance(node, types)), type(node).__name__)
    raise _fail(f"{what} not allowed ({_snippet(node, source)})")


def _call(node: ast.Call, source: str) -> Number:
    if not isinstance(node.func, ast.Name):
        raise _fail(f"only plain function calls are allowed ({_snippet(node.func, source)})")
    name = node.func.id
    if name not in _FUNCTIONS:
        raise _fail(f"function {name!r} is not allowed; allowed: {', '.join(sorted(_FUNCTIONS))}")
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise _fail(f"{name}() takes plain positional arguments only")
    function, fewest, most = _FUNCTIONS[name]
    if not fewest <= len(node.args) <= most:
        count = str(fewest) if fewest == most else f"{fewest} to {most}"
        raise _fail(f"{name}() takes {count} argument(s), got {len(node.args)}")
    args = [_eval(a, source) for a in node.args]
    return _checked(function(*args))


def format_number(value: Number) -> str:
    """Ints exactly; others as a float with up to 12 significant digits ("42.0" -> "42")."""
    if isinstance(value, Fraction) and value.denominator == 1:
        value = value.numerator
    if isinstance(value, int):
        return str(value)
    number = float(value)
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.12g}"


def evaluate(expression: str) -> str:
    """The value of an arithmetic ``expression``, as text. Raises ``ToolError`` if refused.

    >>> evaluate("3 * (4 + 5) / 2")
    '13.5'
    """
    text = expression.strip()
    if not text:
        raise _fail("empty expression")
    if len(text) > MAX_CHARS:
        raise _fail(f"expression is {len(text)} characters long (limit {MAX_CHARS})")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        reason = getattr(exc, "msg", None) or type(exc).__name__
        raise _fail(f"not a valid arithmetic expression ({reason}): {text[:60]!r}") from None
    nodes = sum(isinstance(n, ast.expr) for n in ast.walk(tree))
    if nodes > MAX_NODES:
        raise _fail(f"expression has {nodes} parts (limit {MAX_NODES})")
    try:
        return format_number(_eval(tree.body, text))
    except ZeroDivisionError:
        raise _fail("division by zero") from None
    except OverflowError:
        raise _fail("result is too large for a float") from None
    except (ValueError, TypeError) as exc:
        raise _fail(f"cannot compute: {exc}") from None


# Extraction: words and symbols people write, mapped to Python operators first.
_WORDS = [
    (r"\bto the power of\b", "**"),
    (r"\bmultiplied by\b", "*"),
    (r"\bdivided by\b", "/"),
    (r"\bmod(?:ulo)?\b", "%"),
    (r"\bplus\b", "+"),
    (r"\bminus\b", "-"),
    (r"\btimes\b", "*"),
]
_SYMBOL_MAP = str.maketrans({"×": "*", "÷": "/", "−": "-", "·": "*"})
_THOUSANDS = re.compile(r"(?<=\d),\d{3}(?!\d)")
_TIMES_X = re.compile(r"(?<=[\d)])[ \t]*[xX][ \t]*(?=[\d(.])")
_RUN = re.compile(
    r"(?:\b(?:abs|round|min|max|sqrt|floor|ceil)[ \t]*\("
    r"|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\d+|\*\*|[-+*/%(),]|[ \t])+"
)


def _normalize(text: str) -> str:
    text = text.translate(_SYMBOL_MAP).replace("^", "**")
    for pattern, operator in _WORDS:
        text = re.sub(pattern, f" {operator} ", text, flags=re.IGNORECASE)
    text = _TIMES_X.sub(" * ", text)
    # "1,234" is a thousands separator outside parentheses; inside, "max(3,500)" has 2 args.
    out, depth = [], 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if not (ch == "," and depth <= 0 and _THOUSANDS.match(text, i)):
            out.append(ch)
    return "".join(out)


def _clean(run: str) -> str:
    """Drop unmatched parentheses and dangling operators around a run."""
    keep, opened = [True] * len(run), []
    for i, ch in enumerate(run):
        if ch == "(":
            opened.append(i)
        elif ch == ")":
            if opened:
                opened.pop()
            else:
                keep[i] = False
    for i in opened:
        keep[i] = False
    text = re.sub(r"[ \t]+", " ", "".join(ch for ch, k in zip(run, keep, strict=True) if k))
    text = text.strip()
    while text and (text[0] in "*/%,)" or text[-1] in "+-*/%,("):
        text = text[1:] if text[0] in "*/%,)" else text[:-1]
        text = text.strip()
    return text


def _rank(candidate: str) -> tuple[bool, bool, int]:
    """Prefer what parses, then what has an operator or a call, then the longest."""
    try:
        body = ast.parse(candidate, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return (False, False, len(candidate))
    bare = isinstance(body, ast.Constant) or (
        isinstance(body, ast.UnaryOp) and isinstance(body.operand, ast.Constant)
    )
    return (not isinstance(body, ast.Tuple), not bare, len(candidate))


def extract_expression(text: str, *, require_operator: bool = False) -> str:
    """The arithmetic expression in a natural-language instruction.

    ``require_operator`` skips bare numbers ("Step 2: ..."), for callers that look further.

    >>> extract_expression("calculate 2^10")
    '2**10'
    """
    candidates = [_clean(m.group()) for m in _RUN.finditer(_normalize(text))]
    candidates = [c for c in candidates if any(ch.isdigit() for ch in c)]
    if candidates:
        best = max(candidates, key=_rank)
        if not require_operator or _rank(best)[1]:
            return best
    raise _fail("no arithmetic expression in the instruction")
