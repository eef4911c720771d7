"""Plain-text uploads in whatever encoding they come in: UTF-8/16 first, then detected.

Team shares hold text in legacy encodings: GB18030 (GBK, GB2312) on mainland Chinese Windows,
Big5 in Taiwan and Hong Kong, Shift-JIS, cp1252 in Western Europe. Decoding those as cp1252 (the
old fallback) stored mojibake that no search ever found. Now the encoding is detected
(charset-normalizer, among `CANDIDATES`), and a file whose bytes read as no candidate is refused
with the reason instead of stored garbled.

GB18030 and Big5 overlap: most Big5 byte pairs are valid GB18030 too, and a detector can take a
short text for the wrong one (你好 in GB18030 reads as Big5's 斕疑). Where both decode, the one
whose characters Chinese text actually uses more (jieba's dictionary frequencies, on the text
mapped to Simplified) wins.
"""

from __future__ import annotations

import codecs
import math

import charset_normalizer
import zhconv
from django.utils.translation import gettext_noop

from retrieval.analyzer import chinese_segmenter

CANDIDATES = ("utf_8", "gb18030", "big5", "shift_jis", "euc_kr", "cp1252")
CHINESE_ENCODINGS = ("gb18030", "big5")
BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


class UnknownEncodingError(ValueError):
    """The bytes read as none of the encodings tried; `message` says so in English, marked for
    translation (the upload's failure reason, shown in each user's language)."""

    message = gettext_noop(
        "The text's encoding could not be recognised (tried UTF-8, GB18030, Big5, "
        "Shift-JIS, EUC-KR, Windows-1252); save the file as UTF-8 and upload it again."
    )

    def __init__(self) -> None:
        super().__init__(self.message)


def has_utf16_bom(data: bytes) -> bool:
    """UTF-16 text holds NUL bytes; its byte-order mark tells it from a binary file."""
    return data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))


def decode_text(data: bytes) -> str:
    """`data` as text; UnknownEncodingError (with the reason) when no encoding fits."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                break
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    best = charset_normalizer.from_bytes(data, cp_isolation=list(CANDIDATES)).best()
    if best is None:
        raise UnknownEncodingError()
    if best.encoding in CHINESE_ENCODINGS:
        return _likeliest_chinese(data)
    return str(best)


def _likeliest_chinese(data: bytes) -> str:
    readings = []
    for encoding in CHINESE_ENCODINGS:
        try:
            readings.append(data.decode(encoding))
        except UnicodeDecodeError:
            continue
    return max(readings, key=_commonness)


def _commonness(text: str) -> float:
    """Mean log-frequency of the text's Han characters in Chinese (jieba's counts)."""
    frequencies = chinese_segmenter().FREQ
    han = [c for c in zhconv.convert(text, "zh-cn") if "\u4e00" <= c <= "\u9fff"]
    if not han:
        return 0.0
    return sum(math.log1p(frequencies.get(c, 0)) for c in han) / len(han)
