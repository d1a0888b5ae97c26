"""Linear-time equivalents of the instruction-following checks' regexes that backtrack on a model's text.

Each function returns exactly what `re.findall` of the pattern it names returns (or counts), but scans the text once:
Python's `re` retries a failed match at every later start, so `"[" * 99_000` against `\\[.*?\\]` (each start scanning to
the line's end) or `"\\n" * 99_000` against `^\\s*-.*$` (MULTILINE: each line start's `\\s*` running to the end of the
blank run) costs O(n^2): 30 s and more for one verify. The equivalences are spelled out per function; a randomized
test against the regexes keeps them (tests/security/test_linear_checks.py).

Python's `.` is any character but "\\n", `^`/`$` under MULTILINE match at "\\n" only, and `\\s` is `str.isspace`.
"""

from __future__ import annotations


def _line_end(text: str, at: int) -> int:
    end = text.find("\n", at)
    return len(text) if end < 0 else end


def count_bracketed(text: str) -> int:
    """`len(re.findall(r"\\[.*?\\]", text))`: a "[" and the first "]" after it on its line. A "[" with no "]" before
    its line ends cannot match, nor can any later "[" of that line: the scan moves to the next line."""
    count, at = 0, 0
    while (start := text.find("[", at)) >= 0:
        end = _line_end(text, start)
        close = text.find("]", start + 1, end)
        if close < 0:
            at = end + 1
        else:
            count, at = count + 1, close + 1
    return count


def double_angle_spans(text: str) -> list[str]:
    """`re.findall(r"<<[^\\n]+>>", text)`: per line, from its first "<<" to its last ">>" (greedy), at least one
    character between; then nothing more on that line (no ">>" is left after the last one)."""
    spans, at = [], 0
    while (start := text.find("<<", at)) >= 0:
        end = _line_end(text, start)
        close = text.rfind(">>", start + 3, end)
        if close >= 0:
            spans.append(text[start:close + 2])
        at = end + 1
    return spans


def count_bullets(text: str, marker: str) -> int:
    r"""`len(re.findall(r"^\s*\*[^\*].*$", text, re.M))` for marker "*", `r"^\s*-.*$"` for "-".

    At a line start p, greedy `\s*` takes the whitespace run p..q (newlines included); backtracking cannot help,
    every shorter run ends on whitespace, not on the marker. So a match needs the marker at q ("*" then a character
    that is not "*", which may be a newline: then `.*` runs on the next line). A failure holds for every line start
    inside the run too (same q): the scan resumes at the first line start after q. A match resumes at its end."""
    n, count, p = len(text), 0, 0  # p: a position where `^` matches
    while p <= n:
        q = p
        while q < n and text[q].isspace():
            q += 1
        if q < n and text[q] == marker and (marker == "-" or (q + 1 < n and text[q + 1] != "*")):
            count += 1
            m = _line_end(text, q + 2 if marker == "*" else q + 1)  # where `.*$` ends
            if 0 < m < n and text[m - 1] == "\n":  # `^` holds at the match's end: the next attempt is there
                p = m
                continue
            after = m
        else:
            after = q
        nl = text.find("\n", after)
        if after >= n or nl < 0:
            break
        p = nl + 1
    return count


def word_span_matches(text: str, first: str, last: str) -> list[str]:
    """`re.findall(rf"{first} .*? {last}", text)` for literal words: `first` + " ", then the shortest run of the
    line up to " " + `last`. Where none follows on the line, no later start of that line can match either."""
    head, tail, found, at = first + " ", " " + last, [], 0
    while (start := text.find(head, at)) >= 0:
        end = _line_end(text, start)
        close = text.find(tail, start + len(head), end)
        if close < 0:
            at = end + 1
            continue
        stop = close + len(tail)
        found.append(text[start:stop])
        at = stop
    return found
