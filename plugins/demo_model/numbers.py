"""Numbers as people write them in a question: digits, English words ("twenty-five", "three hundred and
two") and Chinese numerals ("二十五", "三百零二", "两千"). The trained demo model reads any of them and writes
digits in its calculator call; the corpus renders the question's numbers with these."""
from __future__ import annotations

import random

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ZH_DIGITS = "零一二三四五六七八九"


def english(n: int, rng: random.Random | None = None, spaced: float = 0.0) -> str:
    """0 <= n < 10000 in English words; with `rng`, "and" after hundreds and "a hundred" vary, and a compound of
    tens is written "twenty three" instead of "twenty-three" with probability `spaced` (0: no draw, so the
    corpus's older stream stays the same)."""
    if not 0 <= n < 10000:
        raise ValueError(f"english() takes 0..9999, not {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        if n % 10 == 0:
            return _TENS[n // 10]
        joint = " " if spaced and rng is not None and rng.random() < spaced else "-"
        return _TENS[n // 10] + joint + _ONES[n % 10]
    if n < 1000:
        head = _hundreds_head(n // 100, "hundred", rng)
        if n % 100 == 0:
            return head
        joint = " and " if rng is not None and rng.random() < 0.4 else " "
        return head + joint + english(n % 100, rng if spaced else None, spaced)
    head = _hundreds_head(n // 1000, "thousand", rng)
    rest = n % 1000
    if rest == 0:
        return head
    return head + (" and " if rest < 100 and rng is not None and rng.random() < 0.5 else " ") + \
        english(rest, rng, spaced)


def _hundreds_head(k: int, unit: str, rng: random.Random | None) -> str:
    if k == 1 and rng is not None and rng.random() < 0.3:
        return "a " + unit
    return f"{_ONES[k]} {unit}"


def chinese(n: int, rng: random.Random | None = None) -> str:
    """0 <= n < 10000 as a Chinese numeral: 十二, 二十五, 一百零五, 三百, 两千零八; with `rng`, 两 or 二 before 百/千."""
    if not 0 <= n < 10000:
        raise ValueError(f"chinese() takes 0..9999, not {n}")
    if n < 10:
        return _ZH_DIGITS[n]
    if n < 20:
        return "十" + ("" if n == 10 else _ZH_DIGITS[n % 10])
    out, zero = "", False
    for value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        d = (n // value) % 10
        if d == 0:
            zero = bool(out)
            continue
        if zero:
            out += "零"
            zero = False
        digit = "两" if d == 2 and unit in ("千", "百") and rng is not None and rng.random() < 0.5 else _ZH_DIGITS[d]
        out += digit + unit
    return out
