"""Text normalisation for English and Chinese, as the reference (chattts==0.2.5) does it, plus
readings it lacks: numbers, dates, times, money, units and a few symbols become words (num2words
for English, cn2an for Chinese; the reference drops digits). Then the reference's rules: the
language is Chinese when it has more Chinese characters than English words; Chinese text takes
full-width punctuation; `!` ends a sentence, `: ; ( ) < > -` and the Chinese brackets become
commas; every other character but ASCII letters, CJK ideographs, `，。、,.` and spaces is dropped
(`?` and apostrophes too); a Chinese character the tokenizer lacks is replaced by one it has
(velocity.tts.homophones). Control tokens pass through.

Not wetext (WeTextProcessing's grammars): on the cases of tests/unit/tts/test_frontend.py it read money
with cents, thousands and text with control tokens wrongly (docs/benchmarks/history.md, "wetext
against our normaliser")."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import cn2an
from num2words import num2words

from velocity.tts.control import CONTROL  # noqa: E402 (re-exported: the front end's names)
BRACKETED = re.compile(r"\[[^\[\]\s]{1,32}\]")
CJK = re.compile(r"[\u4e00-\u9fff]")

EN_UNITS = {"km/h": "kilometer per hour", "mph": "mile per hour", "km": "kilometer", "kg": "kilogram",
            "cm": "centimeter", "mm": "millimeter", "mg": "milligram", "ml": "milliliter", "m": "meter",
            "g": "gram", "l": "liter", "gb": "gigabyte", "mb": "megabyte", "kb": "kilobyte", "tb": "terabyte",
            "hz": "hertz", "khz": "kilohertz", "min": "minute", "h": "hour", "s": "second", "ms": "millisecond",
            "°c": "degree Celsius", "°f": "degree Fahrenheit", "%": "percent"}
ZH_UNITS = {"km/h": "公里每小时", "km": "公里", "kg": "千克", "cm": "厘米", "mm": "毫米", "mg": "毫克", "ml": "毫升",
            "m": "米", "g": "克", "l": "升", "gb": "G", "mb": "兆", "°c": "摄氏度", "°f": "华氏度", "h": "小时",
            "min": "分钟", "s": "秒"}
EN_CURRENCY = {"$": "USD", "€": "EUR", "£": "GBP"}
EN_CURRENCY_NAME = {"$": "dollars", "€": "euros", "£": "pounds"}
MONEY_LIMIT = 1e15                     # num2words' currency reading works in floats below this
ZH_CURRENCY = {"$": "美元", "€": "欧元", "£": "英镑", "¥": "元", "￥": "元"}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
NUM = r"-?\d[\d,]*(?:\.\d+)?"
UNIT_RE = "|".join(sorted((re.escape(u) for u in EN_UNITS if u != "%"), key=len, reverse=True))


@dataclass
class Normalized:
    """The normalised text, its language, and what was dropped."""

    text: str
    lang: str
    removed: int = 0                                     # characters the tokenizer cannot encode
    unknown_tokens: list[str] = field(default_factory=list)   # bracketed tokens that are not controls


def detect_language(text: str) -> str:
    """The reference's rule: Chinese when it has more Chinese characters than English words."""
    return "zh" if len(CJK.findall(text)) > len(re.findall(r"\b[A-Za-z]+\b", text)) else "en"


# The reference's punctuation: Chinese text first takes full-width forms (ZH_FULL), then in either
# language these become commas or full stops (TO_COMMA); what is left outside KEEP is dropped.
ZH_FULL = str.maketrans({",": "，", ".": "。", "!": "！", "?": "？", ":": "：", ";": "；", "(": "（", ")": "）",
                         "-": "－", "<": "＜", ">": "＞"})
TO_COMMA = str.maketrans({**{c: "，" for c in "：；（）【】『』「」《》－"}, "！": "。",
                          **{c: "," for c in ":;()<>-"}, "!": "."})
KEEP = re.compile(r"[\u4e00-\u9fffA-Za-z，。、,. ]")


def words(n: int, **kw) -> str:
    """num2words without hyphens ("twenty-four" -> "twenty four": a hyphen would become a comma)."""
    return num2words(n, **kw).replace("-", " ")


def _en_number(s: str) -> str:
    s = s.replace(",", "")
    neg = s.startswith("-")
    s = s.lstrip("-")
    if "." in s:
        whole, frac = s.split(".")
        words = f"{num2words(int(whole))} point {' '.join(num2words(int(d)) for d in frac)}"
    else:
        n = int(s)
        words = num2words(n, to="year") if 1100 <= n <= 2099 and len(s) == 4 else num2words(n)
    return ("minus " if neg else "") + words.replace("-", " ").replace(",", "")


def _plural(unit: str, number: str) -> str:
    """'kilometer' -> 'kilometers', 'degree Celsius' -> 'degrees Celsius'; singular for one."""
    if number.lstrip("-") == "1" or unit.endswith("hertz"):
        return unit
    if unit.startswith("degree"):
        return unit.replace("degree", "degrees")
    head, _, rest = unit.partition(" ")
    return f"{head}s {rest}" if rest else unit + "s"


def normalize_en(text: str) -> str:
    t = text
    t = re.sub(r"(\d{4})-(\d{1,2})-(\d{1,2})", lambda m: f"{MONTHS[int(m[2]) - 1]} "
               f"{words(int(m[3]), to='ordinal')}, {words(int(m[1]), to='year')}"
               if 1 <= int(m[2]) <= 12 and 1 <= int(m[3]) <= 31 else m[0], t)
    t = re.sub(r"([$€£])\s?(\d[\d,]*(?:\.\d\d)?)", lambda m: _en_money(m[1], m[2]), t)
    t = re.sub(r"\b(\d{1,2}):(\d{2})\s?([ap])\.?m\.?\b", lambda m: f"{_en_time(m[1], m[2])} {m[3]} m", t, flags=re.I)
    t = re.sub(r"\b(\d{1,2}):(\d{2})\b", lambda m: _en_time(m[1], m[2]), t)
    t = re.sub(r"\b(\d+)(st|nd|rd|th)\b", lambda m: num2words(int(m[1]), to="ordinal").replace("-", " "), t)
    t = re.sub(rf"({NUM})\s?%", lambda m: f"{_en_number(m[1])} percent", t)
    t = re.sub(rf"({NUM})\s?({UNIT_RE})(?![A-Za-z])", lambda m: f"{_en_number(m[1])} "
               f"{_plural(EN_UNITS[m[2].lower()], m[1])}", t, flags=re.I)
    t = re.sub(NUM, lambda m: _en_number(m[0]) if any(c.isdigit() for c in m[0]) else m[0], t)
    t = t.replace("&", " and ").replace("+", " plus ").replace("=", " equals ")
    return t


def _en_money(symbol: str, amount: str) -> str:
    value = float(amount.replace(",", ""))
    if value >= MONEY_LIMIT:           # an amount no float holds to the cent: the number, then the currency
        return f"{_en_number(amount)} {EN_CURRENCY_NAME[symbol]}"
    words = num2words(value, to="currency", currency=EN_CURRENCY[symbol]).replace(", zero cents", "")
    if value != 1:
        words = re.sub(r"\beuro\b", "euros", words)
    return words.replace("-", " ").replace(",", "")


def _en_time(h: str, m: str) -> str:
    hh, mm = int(h), int(m)
    if mm == 0:
        return f"{words(hh)} o clock"
    return f"{words(hh)} {'oh ' if mm < 10 else ''}{words(mm)}"


def normalize_zh(text: str) -> str:
    t = text
    t = re.sub(r"(\d{1,2})[:：](\d{2})", lambda m: f"{cn2an.an2cn(int(m[1]))}点"
               + (f"{cn2an.an2cn(int(m[2]))}分" if int(m[2]) else "整"), t)
    t = re.sub(r"([$€£¥￥])\s?(\d[\d,]*(?:\.\d+)?)", lambda m: f"{m[2].replace(',', '')}{ZH_CURRENCY[m[1]]}", t)
    t = re.sub(r"(\d[\d,]*(?:\.\d+)?)\s?(km/h|km|kg|cm|mm|mg|ml|°c|°f|gb|mb|min|m|g|l|h|s)(?![A-Za-z])",
               lambda m: f"{m[1].replace(',', '')}{ZH_UNITS[m[2].lower()]}", t, flags=re.I)
    t = re.sub(r"(\d),(\d{3})", r"\1\2", t)
    t = cn2an.transform(t, "an2cn")
    t = re.sub(r"\d+", lambda m: "".join("零一二三四五六七八九"[int(d)] for d in m[0]), t)   # leftovers digit by digit
    return t


class Normalizer:
    """normalize(text) -> Normalized. replace(ch) -> the character to write for a Chinese
    character (itself, a homophone the tokenizer has, or "" to drop it)."""

    def __init__(self, replace: Callable[[str], str] = lambda ch: ch) -> None:
        self.replace = replace

    def normalize(self, text: str, lang: str | None = None) -> Normalized:
        lang = lang or detect_language(text)
        parts, unknown, out = re.split(f"({BRACKETED.pattern})", text), [], []
        for part in parts:
            if BRACKETED.fullmatch(part):
                if CONTROL.fullmatch(part):
                    out.append(part)
                else:
                    unknown.append(part)
                continue
            part = normalize_zh(part).translate(ZH_FULL) if lang == "zh" else normalize_en(part)
            out.append(part.translate(TO_COMMA))
        joined, removed = self._filter("".join(out))
        return Normalized(re.sub(r"\s+", " ", joined).strip(), lang, removed, unknown)

    def _filter(self, text: str) -> tuple[str, int]:
        kept, removed = [], 0
        for part in re.split(f"({CONTROL.pattern})", text):
            if CONTROL.fullmatch(part):
                kept.append(part)
                continue
            for ch in part:
                ch = " " if ch.isspace() else ch
                if CJK.fullmatch(ch):
                    ch = self.replace(ch)
                if ch and KEEP.fullmatch(ch):
                    kept.append(ch)
                else:
                    removed += 1
        return "".join(kept), removed


def split_text(text: str) -> list[str]:
    """The reference's split of a text into the pieces it speaks one by one: at newlines if it
    has any, else after each `。` and each `. `."""
    pieces = text.split("\n") if "\n" in text else re.split(r"(?<=。)|(?<=\.\s)", text)
    return [p for p in pieces if p]


def split_sentences(text: str, max_chars: int = 120) -> list[str]:
    """A normalised piece in parts of at most max_chars (the reference has no limit; one part is
    one generation, capped at max_new_tokens frames): at commas, else at a space, else anywhere,
    but never inside a word that has spaces around it or a control token."""
    out, s = [], text.strip()
    while len(s) > max_chars:
        cut = _cut_point(s, max_chars)
        out.append(s[:cut].strip())
        s = s[cut:].strip()
    return out + [s] if s else out


def _cut_point(s: str, max_chars: int) -> int:
    cut = max(s.rfind("，", 0, max_chars), s.rfind(",", 0, max_chars)) + 1
    if cut <= 0:
        cut = s.rfind(" ", 0, max_chars)
        cut = cut if cut > 0 else max_chars
    for m in CONTROL.finditer(s):
        if m.start() < cut < m.end():
            cut = m.start() if m.start() > 0 else m.end()
    return cut
