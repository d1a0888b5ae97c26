"""Answer-letter extraction for multiple-choice answers: NeMo Gym 0.7.0 `mcqa`'s grading modes.

Model text is hostile (megabytes, NUL bytes, text that looks like a regex), so every scan here is linear in its
length: boxes and `\\text{}` wrappers are walked with indices, and the regexes over model text have no nested
or look-ahead quantifiers. The row's own `output_regex` patterns run under a timeout (the `regex` module).
"""

from __future__ import annotations

import re
import unicodedata
from collections import deque
from collections.abc import Sequence

import regex

from gymflow.kernel.errors import VerifierError

ROW_MODES = ("strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon")
# NeMo Gym offers the markdown-aware mode only as a server setting (here: the run's `grading_mode` option).
ALL_MODES = (*ROW_MODES, "lenient_answer_colon_md")

# The `lenient_answer_colon_md` mode tries the payloads after `Answer:` (or the row's prefix) from the last
# one back; bounded so a reply with a million prefixes on one line costs linear time, not quadratic.
MAX_PAYLOADS = 64
MAX_PAYLOAD_CHARS = 4096

Options = Sequence[dict[str, str | None]]

_BOX = "\\boxed{"
_TEXT = "\\text{"
_ASCII_LETTER = re.compile(r"[A-Za-z]")
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
_ANSWER_COLON_MD = re.compile(r"[*_]{0,2}Answer[*_]{0,2}\s*:[*_\s]{0,2}(.+)", re.IGNORECASE | re.MULTILINE)
_ISOLATED_LETTER = re.compile(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])")
_LIST_SEPARATOR = re.compile(r"\s*[/|&,;]\s*|\s+(?:or|and)\s+|\s+", re.IGNORECASE)
_LEADING_LETTER = re.compile(r"[a-zA-Z](?![a-zA-Z0-9])")
_STANDALONE_UPPER = re.compile(r"\b[A-Z]\b")
# Localised option letters (MMMLU-style Arabic and Bengali, full-width) read as A-D.
_LOCAL_LETTERS = str.maketrans({"أ": " A", "ب": " B", "ج": " C", "د": " D", "অ": " A", "ব": " B", "ড": " C",
                                "ঢ": " D", "Ａ": " A", "Ｂ": " B", "Ｃ": " C", "Ｄ": " D"})


def allowed_letters(options: Options) -> set[str]:
    """The option keys that are one letter with a non-null text, upper-cased."""
    return {k.upper() for entry in options for k, v in entry.items() if len(k) == 1 and k.isalpha() and v is not None}


def _option_texts(options: Options, allowed: set[str]) -> list[tuple[str, str]]:
    return [(k.upper(), v) for entry in options for k, v in entry.items()
            if v is not None and len(k) == 1 and k.upper() in allowed]


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def boxed_inner(text: str) -> str | None:
    """Everything inside the last `\\boxed{...}` (braces counted), or None when there is none or it never closes."""
    start = text.rfind(_BOX)
    if start < 0:
        return None
    body = start + len(_BOX)
    depth, opening, closing = 1, text.find("{", body), text.find("}", body)
    while closing >= 0:  # each brace is found once: linear however the braces are arranged
        if 0 <= opening < closing:
            depth, opening = depth + 1, text.find("{", opening + 1)
        else:
            depth -= 1
            if depth == 0:
                return text[body:closing]
            closing = text.find("}", closing + 1)
    return None


def strip_text_wrappers(s: str) -> str:
    """`\\text{ \\text{E} }` -> `E`: drop whole-string `\\text{...}` wrappers and the whitespace inside them."""
    lo, hi = 0, len(s)
    while hi - lo >= len(_TEXT) + 1 and s.startswith(_TEXT, lo, hi) and s[hi - 1] == "}":
        lo, hi = lo + len(_TEXT), hi - 1
        while lo < hi and s[lo].isspace():
            lo += 1
        while hi > lo and s[hi - 1].isspace():
            hi -= 1
    return s[lo:hi]


def strict_boxed(text: str, allowed: set[str]) -> str | None:
    """The letter in the last box: the box's only ASCII letter (upper case, any padding), or a leading letter
    followed by `:`, `)`, `.` or `-` (option text after it is ignored). Bare option text is not a letter."""
    inner = boxed_inner(text)
    if inner is None:
        return None
    inner = strip_text_wrappers(inner.strip())
    letter = None
    first = _ASCII_LETTER.search(inner)
    if first is not None and first.group().isupper() and _ASCII_LETTER.search(inner, first.end()) is None:
        letter = first.group()
    else:
        head = inner.lstrip()
        if head[:1].isascii() and head[:1].isupper() and head[1:].lstrip()[:1] in (":", ")", ".", "-"):
            letter = head[0]
    return letter if letter in allowed else None


def boxed_option_text(text: str, options: Options, allowed: set[str]) -> str | None:
    """The one option whose text (case and spacing ignored) appears inside the last box; None if 0 or 2+."""
    inner = boxed_inner(text)
    if inner is None:
        return None
    inner = inner.strip()
    candidates = (_norm(inner), _norm(strip_text_wrappers(inner)))
    matched = {letter for letter, opt in _option_texts(options, allowed)
               if (o := _norm(opt)) and any(o in c for c in candidates)}
    return matched.pop() if len(matched) == 1 else None


def answer_colon(text: str, options: Options, allowed: set[str]) -> str | None:
    """The first `Answer: X` line: a single allowed letter, or text equal to one option's text."""
    m = _ANSWER_COLON.search(text)
    if m is None:
        return None
    candidate = strip_text_wrappers(m.group(1)).strip()
    if len(candidate) == 1 and candidate.isalpha() and candidate.upper() in allowed:
        return candidate.upper()
    wanted = _norm(candidate)
    return next((letter for letter, opt in _option_texts(options, allowed) if _norm(opt) == wanted), None)


def _localised(s: str) -> str:
    return unicodedata.normalize("NFKC", s).translate(_LOCAL_LETTERS).strip()


def _lists_choices(s: str, allowed: set[str]) -> bool:
    """`A/B`, `A or B`, `A, B`: two different allowed letters side by side means the payload hedges."""
    prev: tuple[str, int] | None = None
    for m in _ISOLATED_LETTER.finditer(s):
        letter = m.group().upper()
        if letter not in allowed:
            continue
        if prev is not None and prev[0] != letter and _LIST_SEPARATOR.fullmatch(s, prev[1], m.start()):
            return True
        prev = (letter, m.end())
    return False


def payload_letter(payload: str, allowed: set[str]) -> str | None:
    """One allowed letter from an answer payload: the whole payload, a leading letter, else the last capital
    standing alone. A payload listing several choices gives none."""
    s = _localised(payload).strip().strip("*_` \t\n\r.,;:")
    if _lists_choices(s, allowed):
        return None
    letter = None
    if len(s) == 1:
        letter = s
    elif m := _LEADING_LETTER.match(s):
        letter = m.group()
    else:
        for m in _STANDALONE_UPPER.finditer(s):
            letter = m.group()
    return letter.upper() if letter and letter.upper() in allowed else None


def answer_payloads(text: str, answer_prefix: str | None) -> list[str]:
    """The last MAX_PAYLOADS payloads after `Answer:` (markdown allowed) or the row's prefix, each up to the end
    of its line and at most MAX_PAYLOAD_CHARS long, in text order."""
    text = unicodedata.normalize("NFKC", text)
    found = list(deque(((m.start(), m.group(1)) for m in _ANSWER_COLON_MD.finditer(text)), maxlen=MAX_PAYLOADS))
    if answer_prefix:
        prefix = re.compile(re.escape(unicodedata.normalize("NFKC", answer_prefix)) + r"\s*", re.IGNORECASE)
        # positions only: one long line may hold a million prefixes, and each payload runs to the line's end
        for start, rest in deque(((m.start(), m.end()) for m in prefix.finditer(text)), maxlen=MAX_PAYLOADS):
            cap = min(len(text), rest + MAX_PAYLOAD_CHARS)
            end = text.find("\n", rest, cap)
            found.append((start, text[rest:(cap if end < 0 else end)]))
    found.sort(key=lambda item: item[0])  # stable: at one position the `Answer:` payload sorts first
    return [payload[:MAX_PAYLOAD_CHARS] for _, payload in found[-MAX_PAYLOADS:]]


def answer_colon_md(text: str, allowed: set[str], answer_prefix: str | None) -> str | None:
    """The last payload that names one allowed letter; with a row prefix, the last box as a fallback."""
    for payload in reversed(answer_payloads(text, answer_prefix)):
        if (letter := payload_letter(payload, allowed)) is not None:
            return letter
    return strict_boxed(text, allowed) if answer_prefix else None


def compile_row_regex(pattern: str) -> regex.Pattern[str]:
    """A row's `output_regex`, case-insensitive as NeMo Gym applies it. Raises `regex.error`."""
    return regex.compile(pattern, regex.IGNORECASE | regex.VERSION0)


def custom_regex(text: str, patterns: Sequence[str], options: Options, allowed: set[str],
                 timeout_s: float) -> str | None:
    """The first pattern whose last match gives a letter (trusted even outside the options, as NeMo Gym does)
    or one option's exact text. Raises VerifierError when a pattern runs past `timeout_s` on this text."""
    for i, pattern in enumerate(patterns):
        compiled = compile_row_regex(pattern)
        last = None
        try:
            for m in compiled.finditer(text, timeout=timeout_s, concurrent=True):
                last = m
        except TimeoutError:
            raise VerifierError(f"template_metadata.output_regex[{i}] ran past {timeout_s:g}s on a "
                                f"{len(text):,}-character answer (a pattern that backtracks); fix the row's "
                                "regex or raise the run's regex_timeout_s") from None
        if last is None:
            continue
        captured = _localised(((last.group(1) if compiled.groups else last.group()) or "").strip()).upper()
        if len(captured) == 1 and captured.isalpha():
            return captured
        wanted = _norm(captured)
        letter = next((k for k, opt in _option_texts(options, allowed) if _norm(opt) == wanted), None)
        if letter is not None:
            return letter
    return None
