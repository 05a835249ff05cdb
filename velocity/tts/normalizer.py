"""Text normalisation for English and Chinese: numbers become words, punctuation is mapped to
what the model knows, control tokens pass through. num2words (English) and cn2an (Chinese)
do the number words."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import cn2an
from num2words import num2words

CONTROL = re.compile(r"\[(?:uv_break|v_break|lbreak|laugh|speed_\d|oral_\d|laugh_\d|break_\d)\]")
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
    return "zh" if len(CJK.findall(text)) >= max(1, len(re.findall(r"[A-Za-z]", text)) // 4) else "en"


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
               f"{num2words(int(m[3]), to='ordinal')}, {num2words(int(m[1]), to='year')}"
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
    t = re.sub(r"[!?]", ".", t)
    t = re.sub(r"[;:—–]", ",", t)
    t = re.sub(r"\s-\s|-", " ", t)
    return t


def _en_money(symbol: str, amount: str) -> str:
    value = float(amount.replace(",", ""))
    words = num2words(value, to="currency", currency=EN_CURRENCY[symbol]).replace(", zero cents", "")
    if value != 1:
        words = re.sub(r"\beuro\b", "euros", words)
    return words.replace("-", " ").replace(",", "")


def _en_time(h: str, m: str) -> str:
    hh, mm = int(h), int(m)
    if mm == 0:
        return f"{num2words(hh)} o'clock"
    return f"{num2words(hh)} {'oh ' if mm < 10 else ''}{num2words(mm).replace('-', ' ')}"


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
    t = re.sub(r"[!！?？]", "。", t)
    t = re.sub(r"[;；:：]", "，", t)
    t = t.replace(",", "，").replace(".", "。")
    return t


class Normalizer:
    """normalize(text) -> Normalized. keep(ch) says whether the tokenizer can encode a character."""

    def __init__(self, keep: Callable[[str], bool] = lambda ch: True) -> None:
        self.keep = keep

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
            out.append(normalize_zh(part) if lang == "zh" else normalize_en(part))
        joined, removed = self._filter("".join(out), lang)
        return Normalized(re.sub(r"\s+", " ", joined).strip(), lang, removed, unknown)

    def _filter(self, text: str, lang: str) -> tuple[str, int]:
        kept, removed = [], 0
        for part in re.split(f"({CONTROL.pattern})", text):
            if CONTROL.fullmatch(part):
                kept.append(part)
                continue
            for ch in part:
                ok = ch.isspace() or ch in "，。、,.'" or (ch.isalpha() and self.keep(ch.lower()))
                if ok:
                    kept.append(ch)
                else:
                    removed += 1
        return "".join(kept), removed


SENTENCE_END = re.compile(r"(?<=[。！？!?.])(?!\d)\s*|\n+")


def split_sentences(text: str, max_chars: int = 120) -> list[str]:
    """Split on sentence ends and newlines (both languages); long pieces split again at commas,
    else at a space, else anywhere, but never inside a word that has spaces around it or a control token."""
    out = []
    for s in (p.strip() for p in SENTENCE_END.split(text)):
        while len(s) > max_chars:
            cut = _cut_point(s, max_chars)
            out.append(s[:cut].strip())
            s = s[cut:].strip()
        if s:
            out.append(s)
    return out


def _cut_point(s: str, max_chars: int) -> int:
    cut = max(s.rfind("，", 0, max_chars), s.rfind(",", 0, max_chars)) + 1
    if cut <= 0:
        cut = s.rfind(" ", 0, max_chars)
        cut = cut if cut > 0 else max_chars
    for m in CONTROL.finditer(s):
        if m.start() < cut < m.end():
            cut = m.start() if m.start() > 0 else m.end()
    return cut
