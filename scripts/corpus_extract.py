#!/usr/bin/env python3
"""Build english.txt from two Debian packages (scripts/fetch-corpus.sh).

    corpus_extract.py JANEAUSTENR_DEB TDAVID_DEB OUT

- r-cran-janeaustenr: Jane Austen's six novels as R data (a lazy-load
  database of zlib-compressed, XDR-serialized character vectors, one
  element per line);
- sword-comm-tdavid: C. H. Spurgeon's "The Treasury of David" (1869-1885)
  as a SWORD zCom4 module (zlib-compressed blocks of OSIS markup).

Only the standard library: a .deb is an `ar` archive holding data.tar.xz.
The output is UTF-8 paragraphs (each on one line) separated by one blank
line, Austen's chapters and Spurgeon's psalms interleaved in proportion to
their sizes so any stretch of the file, its held-out end included, holds
both authors. Same packages in, same bytes out.
"""

import gzip
import io
import re
import struct
import sys
import tarfile
import unicodedata
import zlib


def fail(msg):
    sys.exit(f"corpus_extract: {msg}")


def deb_files(path, wanted):
    """The contents of the members of a .deb's data.tar.* named in `wanted`."""
    with open(path, "rb") as f:
        blob = f.read()
    if not blob.startswith(b"!<arch>\n"):
        fail(f"{path} is not a Debian package (no ar header)")
    pos, data = 8, None
    while pos + 60 <= len(blob):
        name = blob[pos : pos + 16].decode().strip().rstrip("/")
        size = int(blob[pos + 48 : pos + 58].decode().strip())
        if name.startswith("data.tar"):
            data = blob[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)
    if data is None:
        fail(f"{path} has no data.tar member")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            name = member.name.lstrip("./")
            if name in wanted:
                out[name] = tar.extractfile(member).read()
    missing = [w for w in wanted if w not in out]
    if missing:
        fail(f"{path} lacks {', '.join(missing)}")
    return out


class RReader:
    """R's XDR serialization format, the parts character vectors and the
    lazy-load index use."""

    def __init__(self, buf):
        self.buf, self.pos, self.refs = buf, 0, []

    def int(self):
        (v,) = struct.unpack_from(">i", self.buf, self.pos)
        self.pos += 4
        return v

    def read(self):
        if self.buf[:2] != b"X\n":
            fail("R data is not in XDR format")
        self.pos = 2
        version = self.int()
        self.int(), self.int()  # writer's and minimum R versions
        if version == 3:
            n = self.int()  # then the native encoding's name
            self.pos += n
        return self.item()

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == 254:  # NILVALUE
            return None
        if kind == 255:  # reference to an earlier symbol
            idx = flags >> 8 or self.int()
            return self.refs[idx - 1]
        if kind in (241, 242, 247, 251, 252, 253):  # environments, markers
            return None
        if kind == 1:  # symbol
            sym = ("symbol", self.item())
            self.refs.append(sym)
            return sym
        if kind == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            s = self.buf[self.pos : self.pos + n]
            self.pos += n
            latin1 = flags & (1 << 2 << 12)
            return s.decode("latin-1" if latin1 else "utf-8")
        if kind == 2:  # pairlist
            if has_attr:
                self.item()
            tag = self.item() if has_tag else None
            car, cdr = self.item(), self.item()
            return [(tag, car)] + (cdr or [])
        n = self.int()
        if kind in (16, 19):  # character vector, list
            value = [self.item() for _ in range(n)]
        elif kind in (10, 13):  # logical, integer
            value = list(struct.unpack_from(f">{n}i", self.buf, self.pos))
            self.pos += 4 * n
        elif kind == 14:  # double
            value = list(struct.unpack_from(f">{n}d", self.buf, self.pos))
            self.pos += 8 * n
        else:
            fail(f"unexpected R object type {kind}")
        if has_attr:
            attrs = dict((tag[1], v) for tag, v in self.item())
            return {"value": value, "attrs": attrs}
        return value


def tidy(line):
    """Invisible format characters (a stray byte-order mark, zero-width
    spaces) out, runs of white space (no-break spaces too) as one space."""
    line = "".join(c for c in line if unicodedata.category(c) != "Cf")
    return " ".join(line.split())


AUSTEN_DIR = "usr/lib/R/site-library/janeaustenr/data/"
# Publication order.
NOVELS = [
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
]


def austen_novels(deb):
    files = deb_files(deb, [AUSTEN_DIR + "Rdata.rdx", AUSTEN_DIR + "Rdata.rdb"])
    index = RReader(gzip.decompress(files[AUSTEN_DIR + "Rdata.rdx"])).read()
    variables = index["value"][0]
    where = dict(zip(variables["attrs"]["names"], variables["value"]))
    rdb = files[AUSTEN_DIR + "Rdata.rdb"]
    novels = []
    for name in NOVELS:
        if name not in where:
            fail(f"janeaustenr has no data set {name!r}")
        offset, length = where[name]
        (size,) = struct.unpack_from(">I", rdb, offset)
        raw = zlib.decompress(rdb[offset + 4 : offset + length])
        if len(raw) != size:
            fail(f"janeaustenr {name}: {len(raw)} bytes decompressed, header says {size}")
        lines = RReader(raw).read()
        if isinstance(lines, dict):
            lines = lines["value"]
        lines = [line or "" for line in lines]
        if name == "northangerabbey":
            # The package's edition ends with a modern publisher's note on
            # the text: not Austen's.
            try:
                lines = lines[: lines.index("A NOTE ON THE TEXT")]
            except ValueError:
                fail("northangerabbey: the closing 'A NOTE ON THE TEXT' was not found")
        novels.append(lines)
    return novels


CHAPTER = re.compile(r"^(VOLUME|CHAPTER|Chapter) [0-9IVXLC]+\b")


def austen_units(novels):
    """Each novel's chapters (the title page goes with chapter one), as
    lists of paragraphs; hard-wrapped lines are joined."""
    units = []
    for lines in novels:
        paragraphs, current = [], []
        for line in lines + [""]:
            line = line.strip()
            if line:
                current.append(line)
            elif current:
                paragraphs.append(" ".join(current))
                current = []
        # `_word_` marks italics in the Gutenberg transcription; two
        # spaces after a full stop are typewriter habit.
        paragraphs = [tidy(p.replace("_", "")) for p in paragraphs]
        chapters, chapter, seen_chapter = [], [], False
        for p in paragraphs:
            if CHAPTER.match(p) and seen_chapter and chapter:
                # "VOLUME II" then "CHAPTER I" start one unit.
                if not (chapter and CHAPTER.match(chapter[-1])):
                    chapters.append(chapter)
                    chapter = []
            if CHAPTER.match(p):
                seen_chapter = True
            chapter.append(p)
        chapters.append(chapter)
        units.extend(chapters)
    return units


TDAVID_DIR = "usr/share/sword/modules/comments/zcom/tdavid/"
TAG = re.compile(r"<(/?)([A-Za-z]+)[^>]*?(/?)>")
ENTITY = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"', "&apos;": "'"}


def osis_to_paragraphs(osis):
    """OSIS markup to paragraphs: divisions, titles, list items and
    verse lines break paragraphs; emphasis and references keep their
    text."""
    out = []

    def tag(m):
        name = m.group(2)
        if name in ("hi", "reference"):
            return ""
        if name in ("div", "chapter", "milestone", "title", "item", "list", "lg"):
            return "\n\n"
        if name == "l":
            return "\n"
        fail(f"tdavid: unexpected OSIS element <{name}>")

    text = TAG.sub(tag, osis)
    text = re.sub(r"&#(\d+);", lambda m: chr(int(m.group(1))), text)
    text = re.sub(r"&\w+;", lambda m: ENTITY.get(m.group(0)) or fail(f"tdavid: entity {m.group(0)}"), text)
    # A few Latin and French letters are CP437 bytes that were read as C1
    # control characters (\x82 for é, \x91 for æ, ...).
    text = re.sub(r"[\x80-\x9f]", lambda m: bytes([ord(m.group(0))]).decode("cp437"), text)
    for para in text.split("\n\n"):
        lines = [tidy(line) for line in para.split("\n")]
        para = "\n".join(line for line in lines if line)
        if para:
            out.append(para)
    return out


def spurgeon_units(deb):
    names = [TDAVID_DIR + f"ot.cz{x}" for x in "svz"]
    files = deb_files(deb, names)
    blocks_idx, verses, data = (files[n] for n in names)
    blocks = []
    for i in range(0, len(blocks_idx), 12):
        offset, csize, usize = struct.unpack_from("<III", blocks_idx, i)
        block = zlib.decompress(data[offset : offset + csize])
        if len(block) != usize:
            fail(f"tdavid block {i // 12}: {len(block)} bytes, index says {usize}")
        blocks.append(block)
    # The verse index, in canonical order: one entry per verse (block,
    # start, size); a block holds one psalm (the first, the book preface).
    units, seen = {}, set()
    for i in range(0, len(verses), 12):
        block, start, size = struct.unpack_from("<III", verses, i)
        if size == 0 or (block, start) in seen:
            continue
        seen.add((block, start))
        units.setdefault(block, []).append(blocks[block][start : start + size])
    covered = sum(len(b"".join(parts)) for parts in units.values())
    if covered != sum(len(b) for b in blocks):
        fail("tdavid: the verse index does not cover the text exactly")
    out = []
    for block in sorted(units):
        paras = osis_to_paragraphs(b"".join(units[block]).decode("utf-8"))
        if paras:
            out.append(paras)
    return out


def interleave(a, b):
    """Merge two lists of units, each kept in order, taking next from the
    one that has given the smaller share of its bytes so far."""
    size = lambda unit: sum(len(p) + 2 for p in unit)
    total_a, total_b = sum(map(size, a)), sum(map(size, b))
    out, i, j, done_a, done_b = [], 0, 0, 0, 0
    while i < len(a) or j < len(b):
        if j == len(b) or (i < len(a) and done_a * total_b <= done_b * total_a):
            out.append(a[i])
            done_a += size(a[i])
            i += 1
        else:
            out.append(b[j])
            done_b += size(b[j])
            j += 1
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: " + __doc__.strip().splitlines()[2].strip())
    austen_deb, tdavid_deb, out = sys.argv[1:]
    units = interleave(austen_units(austen_novels(austen_deb)), spurgeon_units(tdavid_deb))
    text = "\n\n".join("\n\n".join(unit) for unit in units) + "\n"
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


if __name__ == "__main__":
    main()
