#!/usr/bin/env python3
"""Build the Chinese (and cross-lingual) retrieval evaluation sets from the
Debian Reference, as shipped offline by the Debian packages
``debian-reference-zh-cn`` and ``debian-reference-en``.

Output (BEIR layout: corpus.jsonl, queries.jsonl, qrels/test.tsv):

  eval/debian-reference-zh/        zh passages, Chinese questions
  eval/debian-reference-cross/     en passages, Chinese questions
  eval/debian-reference-cross-en/  zh passages, English questions

Passages are cut from the HTML of both languages in lockstep: the two
translations share section anchors and block structure, so passage
``zh-09-012`` and ``en-09-012`` hold the same content in either language.
Chunk boundaries are chosen from the Chinese text (roughly 100-400
characters per passage, never crossing a section boundary).

The questions are not generated here: they live, hand-written, in
``questions_zh.jsonl``, ``questions_cross_zh2en.jsonl`` and
``questions_cross_en2zh.jsonl`` next to this script, one JSON object a line
with ``id``, ``passage`` (the one relevant corpus id) and ``question``.

The questions were written against Debian Reference 2.100 (Debian 12
bookworm); passage ids depend on the source text, so the builder refuses to
write the sets when the extracted corpora differ from that version (see
CORPUS_SHA256), unless --force is given.

Usage:
    apt-get install debian-reference-zh-cn debian-reference-en   # 2.100
    .venv/bin/python eval/build_debian_reference.py [--src DIR] [--out DIR]

Only the standard library and lxml are used; output is deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import lxml.html

HERE = Path(__file__).resolve().parent
DEFAULT_SRC = Path("/usr/share/debian-reference")

# Chapters of the Debian Reference used for the corpora (all twelve; the
# preface, appendix and index are left out).
CHAPTERS = {
    1: "GNU/Linux tutorials",
    2: "Debian package management",
    3: "The system initialization",
    4: "Authentication and access controls",
    5: "Network setup",
    6: "Network applications",
    7: "GUI System",
    8: "I18N and L10N",
    9: "System tips",
    10: "Data management",
    11: "Data conversion",
    12: "Programming",
}

MIN_CHARS = 100  # a chunk shorter than this is merged into its neighbour
TARGET_CHARS = 200  # stop growing a chunk once it reaches this size
MAX_CHARS = 400  # do not grow a chunk past this (a single block may)
MERGE_LIMIT = 480  # a short tail may be merged if the result stays below
TINY_CHARS = 40  # drop stand-alone sections shorter than this

# SHA-256 of both corpora as extracted from debian-reference 2.100; see corpus_digest().
CORPUS_SHA256 = "cba9a40d685e023eeed508e66a25ca6672c10266f1a7cc7980625ff0d37b550b"

# (corpus language, question file, output directory)
SETS = [
    ("zh", "questions_zh.jsonl", "debian-reference-zh"),
    ("en", "questions_cross_zh2en.jsonl", "debian-reference-cross"),
    ("zh", "questions_cross_en2zh.jsonl", "debian-reference-cross-en"),
]

_CJK = r"\u2e80-\u9fff\u3000-\u303f\uff00-\uffef"
_CJK_GAP = re.compile(rf"(?<=[{_CJK}])\s+(?=[{_CJK}])")
_SPACE = re.compile(r"\s+")
_HEADING_NUM = re.compile(r"^\s*[0-9]+(\.[0-9]+)*\.\s*")


def normalise(text: str, lang: str) -> str:
    """Collapse whitespace; in Chinese drop line-wrap gaps between CJK chars."""
    text = _SPACE.sub(" ", text).strip()
    if lang == "zh":
        text = _CJK_GAP.sub("", text)
    return text


def _skip(el) -> bool:
    """True for paragraphs that are not running text."""
    if "title" in (el.get("class") or "").split():
        return True  # table / figure captions
    for anc in el.iterancestors():
        if anc.tag in ("table", "pre") or (
            anc.tag == "div"
            and (anc.get("class") or "") in ("footnotes", "toc", "navheader", "navfooter")
        ):
            return True
    # A paragraph holding nothing but a cross-reference link (navigation lists).
    text = (el.text or "").strip()
    kids = [k for k in el if isinstance(k.tag, str)]
    return (
        not text
        and len(kids) == 1
        and kids[0].tag == "a"
        and "xref" in (kids[0].get("class") or "")
        and not (kids[0].tail or "").strip()
    )


def parse_chapter(path: Path, lang: str) -> list[tuple[str, str, list[str]]]:
    """Return [(anchor, heading, [paragraph text, ...]), ...] in document order.

    Every paragraph belongs to its innermost enclosing section; paragraphs
    of the chapter introduction (before the first section) are skipped.
    """
    tree = lxml.html.parse(str(path))
    for sup in tree.xpath("//sup[contains(@class,'footnote')] | //a[contains(@class,'footnote')]"):
        sup.drop_tree()
    sections = []
    for sec in tree.xpath("//div[@class='section']"):
        head = sec.xpath(
            "./div[@class='titlepage']//*[self::h2 or self::h3 or self::h4 or self::h5]"
        )
        if not head:
            continue
        anchor = head[0].xpath(".//a/@id")
        anchor = anchor[0] if anchor else ""
        heading = _HEADING_NUM.sub("", normalise(head[0].text_content(), lang))
        blocks = []
        for p in sec.iter("p"):
            owner = next(a for a in p.iterancestors("div") if a.get("class") == "section")
            if owner is not sec:
                continue  # belongs to a nested section
            if _skip(p):
                continue
            text = normalise(p.text_content(), lang)
            if text:
                blocks.append(text)
        sections.append((anchor, heading, blocks))
    return sections


def chunk_sizes(lengths: list[int]) -> list[int]:
    """Group consecutive block lengths into chunks; return the group sizes."""
    groups: list[list[int]] = []
    cur: list[int] = []
    for n in lengths:
        if cur and sum(cur) + n > MAX_CHARS:
            groups.append(cur)
            cur = []
        cur.append(n)
        if sum(cur) >= TARGET_CHARS:
            groups.append(cur)
            cur = []
    if cur:
        if groups and (sum(cur) < MIN_CHARS) and sum(groups[-1]) + sum(cur) <= MERGE_LIMIT:
            groups[-1].extend(cur)
        else:
            groups.append(cur)
    return [len(g) for g in groups]


def build_corpora(src: Path) -> dict[str, list[dict]]:
    corpora: dict[str, list[dict]] = {"zh": [], "en": []}
    for ch in CHAPTERS:
        zh = parse_chapter(src / f"ch{ch:02d}.zh-cn.html", "zh")
        en = parse_chapter(src / f"ch{ch:02d}.en.html", "en")
        if [s[0] for s in zh] != [s[0] for s in en]:
            raise SystemExit(f"chapter {ch}: section anchors differ between zh-cn and en")
        n = 0
        for (anchor, zh_head, zh_blocks), (_, en_head, en_blocks) in zip(zh, en, strict=True):
            if len(zh_blocks) != len(en_blocks):
                raise SystemExit(
                    f"chapter {ch} section {anchor}: "
                    f"{len(zh_blocks)} zh vs {len(en_blocks)} en paragraphs"
                )
            if not zh_blocks or sum(map(len, zh_blocks)) < TINY_CHARS:
                continue
            start = 0
            for size in chunk_sizes([len(b) for b in zh_blocks]):
                n += 1
                for lang, head, blocks in (("zh", zh_head, zh_blocks), ("en", en_head, en_blocks)):
                    corpora[lang].append(
                        {
                            "_id": f"{lang}-{ch:02d}-{n:03d}",
                            "title": head,
                            "text": " ".join(blocks[start : start + size]),
                        }
                    )
                start += size
    return corpora


def corpus_digest(corpora: dict[str, list[dict]]) -> str:
    h = hashlib.sha256()
    for lang in ("zh", "en"):
        for doc in corpora[lang]:
            h.update(json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n")
    return h.hexdigest()


def load_questions(path: Path) -> list[dict]:
    out = []
    if not path.exists():
        return out
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            if set(row) != {"id", "passage", "question"}:
                raise SystemExit(f"{path.name}:{lineno}: expected keys id, passage, question")
            out.append(row)
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_set(out: Path, corpus: list[dict], questions: list[dict]) -> None:
    ids = {d["_id"] for d in corpus}
    qids = [q["id"] for q in questions]
    if len(set(qids)) != len(qids):
        raise SystemExit(f"{out.name}: duplicate query ids")
    missing = [q["id"] for q in questions if q["passage"] not in ids]
    if missing:
        raise SystemExit(f"{out.name}: queries point at unknown passages: {missing[:10]}")
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "corpus.jsonl", corpus)
    write_jsonl(out / "queries.jsonl", [{"_id": q["id"], "text": q["question"]} for q in questions])
    with (out / "qrels" / "test.tsv").open("w", encoding="utf-8", newline="\n") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for q in questions:
            fh.write(f"{q['id']}\t{q['passage']}\t1\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--src", type=Path, default=DEFAULT_SRC, help="folder holding chNN.{zh-cn,en}.html"
    )
    ap.add_argument("--out", type=Path, default=HERE, help="where the sets go (default: eval/)")
    ap.add_argument("--dump", choices=["zh", "en"], help="print one language's passages, exit")
    ap.add_argument("--force", action="store_true", help="write even if the text is not 2.100")
    args = ap.parse_args(argv)

    corpora = build_corpora(args.src)
    digest = corpus_digest(corpora)
    if args.dump:
        write = sys.stdout.write
        for d in corpora[args.dump]:
            write(json.dumps(d, ensure_ascii=False) + "\n")
        return 0
    if digest != CORPUS_SHA256 and not args.force:
        raise SystemExit(
            f"extracted corpus digest {digest} differs from the debian-reference 2.100 one;\n"
            "passage ids may have shifted under the hand-written questions "
            "(use --force to write anyway)"
        )
    for lang, qfile, dirname in SETS:
        questions = load_questions(HERE / qfile)
        write_set(args.out / dirname, corpora[lang], questions)
        print(f"{dirname}: {len(corpora[lang])} passages, {len(questions)} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
