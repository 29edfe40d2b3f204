#!/usr/bin/env python3
"""Generates src/tokenizers/unicode_tables.inc, the Unicode data Kiln's tokenizers need.

    python3 tools/refs/unicode_tables.py

Sources: Python's `unicodedata` (general category, canonical combining class, canonical decompositions,
NFC composition, lower-case mappings) and the `regex` package (pip) for the properties `unicodedata` does not
expose: White_Space, Grapheme_Cluster_Break, Extended_Pictographic and Indic_Conjunct_Break.

Output (all sorted, looked up by binary search):
  kPropertyRanges    {first code point, packed properties}: run-length ranges covering U+0000..U+10FFFF
  kLowercase         {code point, lower-case code point}: simple one-to-one lower-case mappings
  kLowercaseSpecial  {code point, first, second}: mappings to two code points (U+0130 -> i + U+0307)
  kDecomposition     {code point, first, second (0 if none)}: canonical decompositions, one level
  kComposition       {first, second, composite}: primary composites, sorted by (first, second)
  kGeneralCategory   {first code point, category index}: run-length ranges of the general category (index into
                     CATEGORIES, which src/tokenizers/unicode.h's GeneralCategory mirrors) as the `tokenizers`
                     package's Oniguruma sees them (\p{Lu}, \p{Ll}, ... probed over every code point): that is
                     the Unicode version HF tokenizers' Split patterns match with (16.0 for tokenizers 0.23, where
                     unicodedata here has 14.0), and what src/tokenizers/regex.cpp must reproduce
  kCaseFold          {code point, folded code point}: simple case folding where it differs from the code point
                     (str.casefold() of one character when that is one character), for case-insensitive regexes
"""
import os
import sys
import unicodedata

import regex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "src", "tokenizers", "unicode_tables.inc")

# Must match src/tokenizers/unicode.h.
GCB = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend", "SpacingMark", "L", "V",
       "T", "LV", "LVT"]
INCB = ["None", "Consonant", "Extend", "Linker"]
CATEGORIES = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi",
              "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"]
MAX_CP = 0x110000


def is_surrogate(cp):
    return 0xD800 <= cp <= 0xDFFF


def oniguruma_categories():
    """{code point: category} for every code point Oniguruma (in the tokenizers package) puts in a category."""
    # tools/refs/tokenizers.py would shadow the package: import it without this folder on the path.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from tokenizers import Regex, pre_tokenizers
    cps = [cp for cp in range(MAX_CP) if not is_surrogate(cp)]
    text = "".join(map(chr, cps))
    out = {}
    for name in CATEGORIES[1:]:
        if name == "Cs":
            continue  # surrogates cannot be in a Python str passed to tokenizers
        # "removed" keeps the runs between matches; what it drops is the category.
        kept = bytearray(len(text))
        for _, (b, e) in pre_tokenizers.Split(Regex(r"\p{%s}+" % name), behavior="removed").pre_tokenize_str(text):
            kept[b:e] = b"\x01" * (e - b)
        for i, k in enumerate(kept):
            if not k:
                assert cps[i] not in out, (hex(cps[i]), out[cps[i]], name)
                out[cps[i]] = name
    for cp in range(0xD800, 0xE000):
        out[cp] = "Cs"
    return out


def main():
    gcb_res = [(i, regex.compile(r"\p{Grapheme_Cluster_Break=%s}" % name)) for i, name in enumerate(GCB) if i]
    incb_res = [(i, regex.compile(r"\p{InCB=%s}" % name)) for i, name in enumerate(INCB) if i]
    ws_re = regex.compile(r"\p{White_Space}")
    pict_re = regex.compile(r"\p{Extended_Pictographic}")

    def props(cp):
        if is_surrogate(cp):
            return 0
        ch = chr(cp)
        cat = unicodedata.category(ch)
        cls = 1 if cat[0] == "L" else 2 if cat[0] == "N" else 0
        ws = 1 if ws_re.match(ch) else 0
        gcb = next((i for i, r in gcb_res if r.match(ch)), 0)
        pict = 1 if pict_re.match(ch) else 0
        incb = next((i for i, r in incb_res if r.match(ch)), 0)
        ccc = unicodedata.combining(ch)
        return cls | ws << 2 | gcb << 3 | pict << 7 | incb << 8 | ccc << 10

    ranges = []
    prev = None
    for cp in range(MAX_CP):
        p = props(cp)
        if p != prev:
            ranges.append((cp, p))
            prev = p

    onig = oniguruma_categories()
    categories = []
    prev = None
    for cp in range(MAX_CP):
        c = CATEGORIES.index(onig.get(cp, "Cn"))
        if c != prev:
            categories.append((cp, c))
            prev = c
    fold = []
    for cp in range(MAX_CP):
        if is_surrogate(cp):
            continue
        f = chr(cp).casefold()
        if len(f) == 1 and f != chr(cp):
            fold.append((cp, ord(f)))

    lower, lower_special = [], []
    decomp, comp = [], []
    for cp in range(MAX_CP):
        if is_surrogate(cp):
            continue
        ch = chr(cp)
        lo = ch.lower()
        if lo != ch:
            if len(lo) == 1:
                lower.append((cp, ord(lo)))
            else:
                assert len(lo) == 2, hex(cp)
                lower_special.append((cp, ord(lo[0]), ord(lo[1])))
        d = unicodedata.decomposition(ch)
        if d and not d.startswith("<"):
            parts = [int(x, 16) for x in d.split()]
            assert len(parts) in (1, 2)
            decomp.append((cp, parts[0], parts[1] if len(parts) == 2 else 0))
            # A primary composite survives NFC unchanged; exclusions and singletons do not.
            if len(parts) == 2 and unicodedata.normalize("NFC", ch) == ch:
                comp.append((parts[0], parts[1], cp))
    comp.sort()

    def rows(items, per_line):
        out = []
        for i in range(0, len(items), per_line):
            out.append("    " + " ".join("{" + ", ".join("0x%X" % v for v in it) + "}," for it in items[i:i + per_line]))
        return "\n".join(out)

    with open(OUT, "w") as f:
        import tokenizers
        f.write("// Generated by tools/refs/unicode_tables.py from Python %s unicodedata (Unicode %s), regex %s and\n"
                "// tokenizers %s (general categories as its Oniguruma matches them).\n"
                % (sys.version.split()[0], unicodedata.unidata_version, regex.__version__, tokenizers.__version__))
        f.write("// Do not edit by hand. Included by src/tokenizers/unicode.cpp only.\n\n")
        f.write("constexpr PropertyRange kPropertyRanges[] = {\n%s\n};\n\n" % rows(ranges, 6))
        f.write("constexpr CodePointPair kLowercase[] = {\n%s\n};\n\n" % rows(lower, 6))
        f.write("constexpr CodePointTriple kLowercaseSpecial[] = {\n%s\n};\n\n" % rows(lower_special, 4))
        f.write("constexpr CodePointTriple kDecomposition[] = {\n%s\n};\n\n" % rows(decomp, 4))
        f.write("constexpr CodePointTriple kComposition[] = {\n%s\n};\n\n" % rows(comp, 4))
        f.write("constexpr PropertyRange kGeneralCategory[] = {\n%s\n};\n\n" % rows(categories, 6))
        f.write("constexpr CodePointPair kCaseFold[] = {\n%s\n};\n" % rows(fold, 6))
    print("ranges %d lower %d special %d decomp %d comp %d" % (len(ranges), len(lower), len(lower_special),
                                                              len(decomp), len(comp)))


if __name__ == "__main__":
    main()
