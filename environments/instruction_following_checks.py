"""The verifiable instructions: IFEval's 25 and the 29 added for training by open-instruct (54 in all, the set
NeMo Gym's `instruction_following` scores with its `verifiable_instructions` package).

Each checker is `fn(text, **kwargs) -> bool`; `CHECKS` maps an instruction id to the checker and the kwargs it
takes, so a row is validated when it loads. Written for gymflow from the instructions' published semantics
(IFEval, Zhou et al. 2023; open-instruct's IFEvalG); where the reference checks have quirks that decide a
reward (which count is compared, what is stripped) they are kept, so verdicts match NeMo Gym's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gymflow.environments.instruction_following_text import (
    count_sentences,
    count_words,
    detect_language,
    split_into_sentences,
    word_tokenize,
)
from gymflow.environments.linear_scans import count_bracketed, count_bullets, double_angle_spans, word_span_matches

RELATIONS = ("less than", "at least")
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

# kwarg kinds: how a row's value is checked when it loads
INT, STR, STRS, RELATION, LETTER, STR_OR_FIRST, REGEX, REGEXES = (
    "int", "str", "strs", "relation", "letter", "str_or_first", "regex", "regexes")


@dataclass(frozen=True)
class Check:
    fn: Callable[..., bool]
    kwargs: dict[str, str]


def _compare(count: int, relation: str, n: int) -> bool:
    return count < n if relation == "less than" else count >= n


def _search(pattern: str, text: str) -> bool:
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text, flags=re.IGNORECASE))


def _parts(text: str, separator: str) -> list[str] | None:
    """Split on `separator`; empty parts may only be first or last (dropped), else None."""
    parts = re.split(separator, text)
    kept = []
    for i, part in enumerate(parts):
        if part.strip():
            kept.append(part)
        elif i not in (0, len(parts) - 1):
            return None
    return kept


# ---- IFEval ------------------------------------------------------------------------------------------


def response_language(text: str, language: str) -> bool:
    found = detect_language(text)
    return True if found is None else found == language  # undetectable counts as followed, as in IFEval


def number_sentences(text: str, num_sentences: int, relation: str) -> bool:
    return _compare(count_sentences(text), relation, num_sentences)


def number_placeholders(text: str, num_placeholders: int) -> bool:
    return count_bracketed(text) >= num_placeholders  # re.findall(r"\[.*?\]", text), in linear time


def number_bullet_lists(text: str, num_bullets: int) -> bool:
    # The reference's re.findall(r"^\s*\*[^\*].*$") and (r"^\s*-.*$") under MULTILINE, in linear time.
    return count_bullets(text, "*") + count_bullets(text, "-") == num_bullets


def constrained_response(text: str) -> bool:
    return any(option in text.strip() for option in CONSTRAINED_RESPONSES)


def number_highlighted_sections(text: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h.removeprefix("**").removesuffix("**").strip()]
    return len(single) + len(double) >= num_highlights


def multiple_sections(text: str, section_spliter: str, num_sections: int) -> bool:
    sections = re.split(r"\s?" + section_spliter.strip() + r"\s?\d+\s?", text)
    return len(sections) - 1 >= num_sections


def number_paragraphs(text: str, num_paragraphs: int) -> bool:
    kept = _parts(text, r"\s?\*\*\*\s?")
    return kept is not None and len(kept) == num_paragraphs


def postscript(text: str, postscript_marker: str) -> bool:
    marker = postscript_marker.strip()
    # The reference's patterns are r"\s*" + marker + r".*$", searched: the leading `\s*` may match nothing and
    # `.*$` always matches (MULTILINE), so whether they match is whether the marker does; without them the search
    # is linear (`\s*` retried at every start of a long blank run was quadratic).
    if marker == "P.P.S":
        pattern = r"p\.\s?p\.\s?s"
    elif marker == "P.S.":
        pattern = r"p\.\s?s\."
    else:
        pattern = marker.lower()
    return re.search(pattern, text.lower(), flags=re.MULTILINE) is not None


def keyword_existence(text: str, keywords: list[str]) -> bool:
    return all(_search(k, text) for k in keywords)


def keyword_frequency(text: str, keyword: str, frequency: int, relation: str) -> bool:
    return _compare(_count(keyword.strip(), text), relation, frequency)


def number_words(text: str, num_words: int, relation: str) -> bool:
    return _compare(count_words(text), relation, num_words)


def json_format(text: str) -> bool:
    value = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        value = value.removeprefix(prefix)
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def nth_paragraph_first_word(text: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    paragraphs = re.split(r"\n\n", text)
    count = sum(1 for p in paragraphs if p.strip())
    if not 1 <= nth_paragraph <= count:
        return False
    paragraph = paragraphs[nth_paragraph - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    head = re.match(r"[^.,?!'\"]*", word)
    return count == num_paragraphs and (head.group(0) if head else "").lower() == first_word.lower()


def forbidden_words(text: str, forbidden_words: list[str]) -> bool:
    return not any(_search(r"\b" + w + r"\b", text) for w in forbidden_words)


def two_responses(text: str) -> bool:
    responses = text.split("******")
    valid = []
    for i, response in enumerate(responses):
        if response.strip():
            valid.append(response)
        elif i not in (0, len(responses) - 1):
            return False
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


def repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


def end_checker(text: str, end_phrase: str) -> bool:
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


def title(text: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in double_angle_spans(text))  # r"<<[^\n]+>>"


def letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return _compare(text.lower().count(letter.lower()), let_relation, let_frequency)


def _english(text: str) -> bool:
    language = detect_language(text)
    return True if language is None else language == "en"  # undetectable counts as followed, as in IFEval


def english_capital(text: str) -> bool:
    return text.isupper() and _english(text)


def english_lowercase(text: str) -> bool:
    return text.islower() and _english(text)


def no_comma(text: str) -> bool:
    return "," not in text


def capital_word_frequency(text: str, capital_frequency: int, capital_relation: str) -> bool:
    capitals = sum(1 for w in word_tokenize(text) if w.isupper())
    return _compare(capitals, capital_relation, capital_frequency)


def quotation(text: str) -> bool:
    value = text.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'


# ---- open-instruct's training additions --------------------------------------------------------------


def repeat_phrase(text: str, phrase: str, small_n: int) -> bool:
    """`small_n` copies of `phrase`, each with exactly one word changed."""
    ref = phrase.strip().split()
    if all(re.escape(w) == w for w in (ref[0], ref[-1])):  # rf"{ref[0]} .*? {ref[-1]}", in linear time
        found = word_span_matches(text, ref[0], ref[-1])
    else:  # words with pattern characters keep the reference's regex (the task's, bounded by the verify limit)
        found = re.findall(rf"{ref[0]} .*? {ref[-1]}", text)
    if len(found) != small_n or not found:
        return False
    for candidate in found:
        words = candidate.split()
        if len(words) != len(ref) or sum(a != b for a, b in zip(words, ref, strict=True)) > 1:
            return False
    # the reference decides by the last copy alone: it must differ in exactly one word
    return sum(a != b for a, b in zip(found[-1].split(), ref, strict=True)) == 1


def copy_exact(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower() == prompt_to_repeat.strip().lower()


def copy_span_idx(text: str, prompt_to_repeat: str, n_start: int, n_end: int) -> bool:
    return text.strip().lower() == prompt_to_repeat[n_start:n_end].strip().lower()


def sentence_hyphens(text: str) -> bool:
    golds = split_into_sentences(re.sub("-", " ", text))
    return all(s.strip() == s and s == g for s, g in zip(text.split("-"), golds, strict=False))


def no_adjacent_consecutive(text: str) -> bool:
    words = text.split()
    return all(ord(b[0].lower()) - ord(a[0].lower()) != 1 for a, b in zip(words, words[1:], strict=False))


def square_brackets(text: str) -> bool:
    return all(w.startswith("[") and w.endswith("]") for w in text.split())


def word_once(text: str, keyword: str) -> bool:
    return _count(keyword.strip(), text) == 1


def exclude_word_harder(text: str, keyword: str) -> bool:
    return " " + keyword.strip() + " " not in text


def paragraphs_stars(text: str) -> bool:
    kept = _parts(text, r"\s?\*\*\*\s?")
    return kept is not None and len(kept) == 2


def paragraphs_newlines(text: str) -> bool:
    kept = _parts(text, r"\n\n")
    return kept is not None and len(kept) == 2


def first_word_sent(text: str, first_word: str) -> bool:
    sentences = split_into_sentences(text)
    return all(s.strip() and s.split()[0].strip().lower() == first_word.strip().lower() for s in sentences)


def first_word_answer(text: str, first_word: str) -> bool:
    words = text.split()
    return bool(words) and words[0].strip().lower() == first_word.strip().lower()


def _bare(word: str) -> str:
    return re.sub(r"[^\w\s]", "", word.strip()).lower()


def last_word_sent(text: str, last_word: str) -> bool:
    sentences = split_into_sentences(text)
    return all(s.strip() and _bare(s.split()[-1]) == last_word.strip().lower() for s in sentences)


def last_word_answer(text: str, last_word: str) -> bool:
    words = text.split()
    return bool(words) and _bare(words[-1]) == last_word.strip().lower()


def bigram_wrapping(text: str) -> bool:
    words = text.split()
    return all(words[i].startswith("<<") and words[i + 1].endswith(">>") for i in range(0, len(words) - 1, 2))


def copying_multiple(text: str, prompt_to_repeat: str, N: int) -> bool:  # noqa: N803 - the rows' name
    copies = text.split("******")
    return len(copies) == N and all(c.strip().lower() == prompt_to_repeat.strip().lower() for c in copies)


def no_dot(text: str) -> bool:
    return "." not in text


def no_exclamation(text: str) -> bool:
    return "!" not in text


def lowercase_counting(text: str, N: int) -> bool:  # noqa: N803
    return len(re.findall(r"\b[a-z]+\b", text)) <= N


def letter_counting(text: str, N: int, relation: str) -> bool:  # noqa: N803
    return _compare(len(re.findall(r"[a-zA-Z]", text)), relation, N)


def counting_composition(text: str, n_sent: int, n_words: int) -> bool:
    """3 paragraphs (split by ***), each of `n_sent` sentences of `n_words` tokens."""
    paragraphs = re.split(r"\s?\*\*\*\s?", text)
    count = len(paragraphs)
    for i, paragraph in enumerate(paragraphs):
        if not paragraph.strip():
            if i not in (0, len(paragraphs) - 1):
                return False
            count -= 1
        sentences = split_into_sentences(paragraph)
        if len(sentences) != n_sent or any(len(word_tokenize(s)) != n_words for s in sentences):
            return False
    return count == 3


def count_unique(text: str) -> bool:
    words = word_tokenize(text)
    return len(words) == len(set(words))


def count_increment_word(text: str, keyword1: str, keyword2: str) -> bool:
    return _count(keyword1.strip(), text) == 1 and _count(keyword2.strip(), text) == 2


def palindrome(text: str) -> bool:
    return any(w == w[::-1] for w in text.split())


def keyword_specific_position(text: str, keyword: str, n: int, m: int) -> bool:
    sentences = split_into_sentences(text)
    if not 1 <= n <= len(sentences):
        return False
    words = word_tokenize(sentences[n - 1])
    return 1 <= m <= len(words) and words[m - 1] == keyword.strip()


def start_end(text: str) -> bool:
    words = word_tokenize(text)
    return len(words) >= 2 and words[0].lower() == words[-1].lower()


_FREQ = {"keyword": REGEX, "frequency": INT, "relation": RELATION}
_LETTER_FREQ = {"letter": LETTER, "let_frequency": INT, "let_relation": RELATION}

CHECKS: dict[str, Check] = {
    "keywords:existence": Check(keyword_existence, {"keywords": REGEXES}),
    "keywords:frequency": Check(keyword_frequency, _FREQ),
    "keywords:forbidden_words": Check(forbidden_words, {"forbidden_words": REGEXES}),
    "keywords:letter_frequency": Check(letter_frequency, _LETTER_FREQ),
    "language:response_language": Check(response_language, {"language": STR}),
    "length_constraints:number_sentences": Check(number_sentences, {"num_sentences": INT, "relation": RELATION}),
    "length_constraints:number_paragraphs": Check(number_paragraphs, {"num_paragraphs": INT}),
    "length_constraints:number_words": Check(number_words, {"num_words": INT, "relation": RELATION}),
    "length_constraints:nth_paragraph_first_word": Check(
        nth_paragraph_first_word, {"num_paragraphs": INT, "nth_paragraph": INT, "first_word": STR}),
    "detectable_content:number_placeholders": Check(number_placeholders, {"num_placeholders": INT}),
    "detectable_content:postscript": Check(postscript, {"postscript_marker": REGEX}),
    "detectable_format:number_bullet_lists": Check(number_bullet_lists, {"num_bullets": INT}),
    "detectable_format:constrained_response": Check(constrained_response, {}),
    "detectable_format:number_highlighted_sections": Check(number_highlighted_sections, {"num_highlights": INT}),
    "detectable_format:multiple_sections": Check(multiple_sections, {"section_spliter": REGEX, "num_sections": INT}),
    "detectable_format:json_format": Check(json_format, {}),
    "detectable_format:title": Check(title, {}),
    "combination:two_responses": Check(two_responses, {}),
    "combination:repeat_prompt": Check(repeat_prompt, {"prompt_to_repeat": STR}),
    "startend:end_checker": Check(end_checker, {"end_phrase": STR}),
    "change_case:capital_word_frequency": Check(
        capital_word_frequency, {"capital_frequency": INT, "capital_relation": RELATION}),
    "change_case:english_capital": Check(english_capital, {}),
    "change_case:english_lowercase": Check(english_lowercase, {}),
    "punctuation:no_comma": Check(no_comma, {}),
    "startend:quotation": Check(quotation, {}),
    # open-instruct's additions
    "copy:repeat_phrase": Check(repeat_phrase, {"phrase": REGEX, "small_n": INT}),
    "copy:copy": Check(copy_exact, {"prompt_to_repeat": STR}),
    "new:copy_span_idx": Check(copy_span_idx, {"prompt_to_repeat": STR, "n_start": INT, "n_end": INT}),
    "detectable_format:sentence_hyphens": Check(sentence_hyphens, {}),
    "keywords:no_adjacent_consecutive": Check(no_adjacent_consecutive, {}),
    "detectable_format:square_brackets": Check(square_brackets, {}),
    "keywords:word_once": Check(word_once, {"keyword": REGEX}),
    "keywords:word_count_different_numbers": Check(keyword_frequency, _FREQ),
    "keywords:exclude_word_harder": Check(exclude_word_harder, {"keyword": STR}),
    "paragraphs:paragraphs": Check(paragraphs_stars, {}),
    "paragraphs:paragraphs2": Check(paragraphs_newlines, {}),
    "first_word:first_word_sent": Check(first_word_sent, {"first_word": STR}),
    "first_word:first_word_answer": Check(first_word_answer, {"first_word": STR}),
    "last_word:last_word_sent": Check(last_word_sent, {"last_word": STR_OR_FIRST}),
    "last_word:last_word_answer": Check(last_word_answer, {"last_word": STR}),
    "detectable_format:bigram_wrapping": Check(bigram_wrapping, {}),
    "copy:copying_simple": Check(copy_exact, {"prompt_to_repeat": STR}),
    "copy:copying_multiple": Check(copying_multiple, {"prompt_to_repeat": STR, "N": INT}),
    "punctuation:punctuation_dot": Check(no_dot, {}),
    "punctuation:punctuation_exclamation": Check(no_exclamation, {}),
    "count:lowercase_counting": Check(lowercase_counting, {"N": INT}),
    "letters:letter_counting": Check(letter_counting, {"N": INT, "relation": RELATION}),
    "letters:letter_counting2": Check(letter_frequency, _LETTER_FREQ),
    "count:counting_composition": Check(counting_composition, {"n_sent": INT, "n_words": INT}),
    "count:count_unique": Check(count_unique, {}),
    "count:count_increment_word": Check(count_increment_word, {"keyword1": REGEX, "keyword2": REGEX}),
    "keywords:palindrome": Check(palindrome, {}),
    "keywords:keyword_specific_position": Check(
        keyword_specific_position, {"keyword": STR_OR_FIRST, "n": INT, "m": INT}),
    "keywords:start_end": Check(start_end, {}),
}


def kwarg_problem(kind: str, value: Any) -> str | None:
    """Why `value` cannot be a kwarg of this kind, or None."""
    if kind == INT:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"expected a non-negative integer, got {value!r}"[:200]
    if kind == RELATION:
        return None if value in RELATIONS else f"expected one of {list(RELATIONS)}, got {value!r}"[:200]
    if kind == LETTER:
        ok = isinstance(value, str) and len(value) == 1 and "a" <= value.lower() <= "z"
        return None if ok else f"expected one letter a-z, got {value!r}"[:200]
    if kind == STR_OR_FIRST and isinstance(value, list) and value:
        value = value[0]
    if kind in (STRS, REGEXES):
        if not isinstance(value, list) or not value:
            return f"expected a non-empty list of strings, got {value!r}"[:200]
        return next((p for v in value if (p := kwarg_problem(REGEX if kind == REGEXES else STR, v))), None)
    if not isinstance(value, str) or not value.strip():
        return f"expected a non-empty string, got {value!r}"[:200]
    if kind == REGEX:
        try:
            re.compile(value)
        except re.error as e:
            return f"not a valid regular expression ({e}): {value!r}"[:200]
    return None


def normalise(kind: str, value: Any) -> Any:
    return value[0] if kind == STR_OR_FIRST and isinstance(value, list) else value

