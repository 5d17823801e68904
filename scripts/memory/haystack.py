#!/usr/bin/env python3
"""Seeded procedural haystacks with needles, for the long-memory evaluation.

A haystack is varied English made from a small template grammar (so no two
blocks are alike, unlike llama.cpp's passkey test with one repeated
sentence), with needles "The secret code for the <thing> is <7 digits>." at
chosen depths, plus distractor needles for other things. `make(seed, ...)`
returns the text (split in documents), and the needles with their depths.

    python3 scripts/memory/haystack.py --tokens 32000 --seed 1 > hay.txt
"""
import argparse
import json
import random

NAMES = """Alder Bram Cora Dagny Edric Fenna Gideon Hale Isolde Jory Kestrel Lark Maren
Nils Orla Perrin Quill Rowan Sable Tamsin Ulric Vesna Wren Yara Zeb Anselm Brisa
Caspian Delphine Emrys Freya Garrick Hester Ivo Juno Kaito Linnea Magnus Nerys
Osric Petra Ronan Selma Thane Una Viggo Wilda""".split()
PLACES = """harbour mill orchard quarry market chapel bridge forge granary lighthouse
meadow ferry tannery vineyard abbey courtyard garrison observatory bakery
library stable workshop pier greenhouse""".split()
ADJ = """quiet crowded narrow ancient windswept muddy golden crooked silent busy
forgotten distant sunlit frozen humble proud weary cheerful stubborn careful
restless patient bright dim""".split()
VERBS = """repaired visited painted guarded measured sold counted cleaned mapped
described carried opened closed weighed borrowed returned inspected sketched
praised doubted followed remembered""".split()
OBJECTS = """barrels ropes lanterns letters ledgers baskets nets candles tools maps
coins blankets jars bells keys boots sacks crates banners scrolls""".split()
TIMES = """at dawn before noon in the evening after the rain during the festival
on market day by candlelight in early spring at the end of harvest late at night""".split(
    "  "
)
TIMES = ["at dawn", "before noon", "in the evening", "after the rain",
         "during the festival", "on market day", "by candlelight",
         "in early spring", "at the end of harvest", "late at night"]
THINGS = """copper kettle blue lantern iron gate silver flute velvet cloak oak chest
glass hourglass brass compass stone owl painted fan red kite jade ring tin
soldier wool scarf paper crane clay pot amber brooch ivory comb ship model
pewter mug linen map""".split()
THINGS = [" ".join(THINGS[i:i + 2]) for i in range(0, len(THINGS) - 1, 2)]


def sentence(r):
    n, m = r.choice(NAMES), r.choice(NAMES)
    a, p = r.choice(ADJ), r.choice(PLACES)
    v, o, t = r.choice(VERBS), r.choice(OBJECTS), r.choice(TIMES)
    k = r.randint(2, 90)
    forms = [
        f"{n} {v} {k} {o} at the {a} {p} {t}.",
        f"{t.capitalize()}, {n} and {m} walked to the {p} and {v} the {o}.",
        f"The {p} was {a}, so {n} {v} the {o} twice.",
        f"{n} told {m} that the {o} by the {p} had been {v} {t}.",
        f"Nobody at the {a} {p} knew why {n} {v} {k} {o}.",
        f"{m} wrote that the {o} were {v} near the {p} {t}.",
    ]
    return r.choice(forms)


def paragraph(r):
    return " ".join(sentence(r) for _ in range(r.randint(3, 7)))


def needle(thing, code):
    return f"The secret code for the {thing} is {code}."


def make(seed, n_words, depths, n_distractors=2):
    """Text of about `n_words` words with one needle per depth (0..1) and
    distractors; returns (text, [{thing, code, depth}])."""
    r = random.Random(seed)
    paras, words = [], 0
    while words < n_words:
        p = paragraph(r)
        paras.append(p)
        words += len(p.split())
    things = r.sample(THINGS, len(depths) + n_distractors)
    needles = []
    for i, d in enumerate(depths):
        code = "".join(r.choice("0123456789") for _ in range(7))
        needles.append({"thing": things[i], "code": code, "depth": d})
    distract = []
    for t in things[len(depths):]:
        code = "".join(r.choice("0123456789") for _ in range(7))
        distract.append({"thing": t, "code": code, "depth": r.random()})
    # Insert needles (and distractors) into paragraphs at their depths.
    inserts = sorted(needles + distract, key=lambda x: x["depth"])
    for x in reversed(inserts):
        at = min(len(paras) - 1, int(x["depth"] * len(paras)))
        s = paras[at].split(". ")
        k = r.randint(0, len(s) - 1)
        s.insert(k, needle(x["thing"], x["code"]).rstrip("."))
        paras[at] = ". ".join(s)
        if not paras[at].endswith("."):
            paras[at] += "."
    return "\n\n".join(paras) + "\n", needles


def question(thing):
    return f"What is the secret code for the {thing}?"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=24000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depths", default="0.5")
    ap.add_argument("--json", action="store_true", help="print the needles as JSON on stderr")
    a = ap.parse_args()
    text, needles = make(a.seed, a.words, [float(x) for x in a.depths.split(",")])
    print(text, end="")
    if a.json:
        import sys
        print(json.dumps(needles), file=sys.stderr)
