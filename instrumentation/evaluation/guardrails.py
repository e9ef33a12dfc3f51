"""Guardrail checks, cheap and deterministic: PII in the answer (emails, phone numbers, card numbers that pass
the Luhn check, IBANs that pass mod-97, both via python-stdnum), refusals, empty or truncated answers (finish
reason ``length``), an answer in another language than the question (langdetect, seeded). Each yields score
1.0 when it flags, 0.0 when clear; explanations name what was found, never the text."""

from __future__ import annotations

import re
from collections.abc import Sequence

from stdnum import iban, luhn

from infersight.instrumentation.evaluation.base import Result, Sample
from infersight.schemas.quality import EMPTY_OR_TRUNCATED, LANGUAGE_MISMATCH, PII, REFUSAL

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
# a run of digits with the separators phone and card numbers use; each run is then a card (13-19 digits that
# pass Luhn), a phone number (9-15 digits otherwise), or neither
NUMBER_RUN = re.compile(r"(?<![\w+])\+?\d(?:[ .\-()]{0,2}\d){8,18}(?!\w)")
IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
REFUSALS = re.compile(
    r"\b(?:I(?:'m| am) (?:sorry|afraid),? (?:but )?I (?:can(?:no|')t|won't|am unable|'m unable)"
    r"|I (?:can(?:no|')t|won't|am not able to|'m not able to|am unable to|'m unable to) "
    r"(?:help|assist|provide|comply|do that|answer|share)"
    r"|as an AI(?: language model)?, I)", re.IGNORECASE)
MIN_LANGUAGE_CHARS = 20  # shorter texts give langdetect too little to go on


def _digits(s: str) -> str:
    return re.sub(r"\D", "", s)


def pii_found(text: str) -> list[str]:
    """The kinds of PII in ``text`` (sorted, unique)."""
    kinds = set()
    if EMAIL.search(text):
        kinds.add("email")
    if any(iban.is_valid(m.group()) for m in IBAN.finditer(text)):
        kinds.add("iban")
    for m in NUMBER_RUN.finditer(IBAN.sub(" ", text)):  # an IBAN's digits are no card or phone number
        digits = _digits(m.group())
        if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
            kinds.add("card")
        elif 9 <= len(digits) <= 15:
            kinds.add("phone")
    return sorted(kinds)


def _flag(name: str, flagged: bool, why: str = "") -> Result:
    return Result(name, 1.0 if flagged else 0.0, "flagged" if flagged else "clear", why or None)


class Guardrails:
    """All four checks in one evaluator (they share nothing expensive; one queue item runs them together)."""

    name = "guardrails"

    def __init__(self) -> None:
        from langdetect import DetectorFactory

        DetectorFactory.seed = 0  # langdetect samples: seeded, the same text gives the same language

    def language_mismatch(self, question: str, answer: str) -> tuple[bool, str]:
        from langdetect import LangDetectException, detect

        if len(question.strip()) < MIN_LANGUAGE_CHARS or len(answer.strip()) < MIN_LANGUAGE_CHARS:
            return False, ""
        try:
            q, a = detect(question), detect(answer)
        except LangDetectException:
            return False, ""
        return q != a, f"question {q}, answer {a}" if q != a else ""

    def evaluate(self, sample: Sample) -> Sequence[Result]:
        kinds = pii_found(sample.answer)
        empty = not sample.answer.strip()
        truncated = sample.finish_reason == "length"
        mismatch, why = self.language_mismatch(sample.question, sample.answer)
        return (
            _flag(PII, bool(kinds), ", ".join(kinds)),
            _flag(REFUSAL, bool(REFUSALS.search(sample.answer))),
            _flag(EMPTY_OR_TRUNCATED, empty or truncated, "empty" if empty else "finish reason length" if truncated
                  else ""),
            _flag(LANGUAGE_MISMATCH, mismatch, why),
        )
