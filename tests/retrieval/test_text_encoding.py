"""retrieval.text_encoding: text uploads in legacy encodings are read right or refused, never
stored as mojibake."""

from __future__ import annotations

import codecs

import pytest

from retrieval.extract import ExtractionError, extract
from retrieval.text_encoding import UnknownEncodingError, decode_text

SIMPLIFIED = "前缀缓存可以降低首字延迟，连续批处理提升吞吐量。软件包用 apt-get 安装。"
TRADITIONAL = "前綴快取可以降低首字延遲，連續批次處理提升吞吐量。軟體套件用 apt-get 安裝。"


@pytest.mark.parametrize(
    ("text", "encoding"),
    [
        (SIMPLIFIED, "gb18030"),
        (SIMPLIFIED, "gbk"),
        (TRADITIONAL, "big5"),
        (TRADITIONAL, "gb18030"),
        ("日本語のテキストです。カタカナもあります。", "shift_jis"),
        ("Café déjà vu: a naïve résumé costs 5 €.", "cp1252"),
        (SIMPLIFIED, "utf-8"),
    ],
)
def test_text_in_a_legacy_encoding_is_read_as_written(text, encoding):
    assert decode_text(text.encode(encoding)) == text


@pytest.mark.parametrize("text", ["你好", "缓存", "中文"])
def test_short_chinese_is_read_in_the_encoding_whose_characters_chinese_uses(text):
    # in GB18030 these bytes are also valid Big5, reading as rare characters
    assert decode_text(text.encode("gb18030")) == text


def test_byte_order_marks_are_honoured():
    assert decode_text(codecs.BOM_UTF8 + SIMPLIFIED.encode()) == SIMPLIFIED
    assert decode_text(SIMPLIFIED.encode("utf-16")) == SIMPLIFIED


def test_an_upload_in_gb18030_is_extracted_as_chinese_and_utf16_is_not_binary():
    [section] = extract(SIMPLIFIED.encode("gb18030"), "notes.txt")
    assert section.text == SIMPLIFIED
    [section] = extract(TRADITIONAL.encode("utf-16"), "notes.md")
    assert section.text == TRADITIONAL


def test_bytes_that_are_no_known_encoding_are_refused_with_the_reason():
    garbage = bytes(range(0x80, 0x100)) * 8
    with pytest.raises(UnknownEncodingError, match="save the file as UTF-8"):
        decode_text(garbage)
    with pytest.raises(ExtractionError, match="encoding could not be recognised"):
        extract(garbage, "notes.txt")


@pytest.mark.parametrize(
    ("text", "encoding"), [(SIMPLIFIED, "gb18030"), (TRADITIONAL, "big5")], ids=["gb18030", "big5"]
)
def test_an_html_page_in_a_chinese_encoding_is_read_as_written_declared_or_not(text, encoding):
    body = f"<html><body><h1>{text[:4]}</h1><p>{text}</p></body></html>"
    [section] = extract(body.encode(encoding), "page.html")  # no charset: detected
    assert (section.heading_path, section.text) == ([text[:4]], text)
    declared = f'<html><head><meta charset="{encoding}"></head><body><p>{text}</p></body></html>'
    assert extract(declared.encode(encoding), "page.html")[0].text == text


def test_an_html_page_in_no_known_encoding_and_no_declaration_is_refused():
    page = b"<html><body><p>" + bytes(range(0x80, 0x100)) * 8 + b"</p></body></html>"
    with pytest.raises(ExtractionError, match="encoding could not be recognised"):
        extract(page, "page.html")
