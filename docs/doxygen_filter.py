#!/usr/bin/env python3
"""Doxygen input filter for ampc's public headers (docs/Doxyfile.in).

The headers are written for people reading them: plain C comments, a
tutorial at the top of each file, a comment above each declaration or
after each field. This filter lets Doxygen read the same comments without
the headers carrying Doxygen markup: the first comment becomes the file's
documentation (its "name.h -- summary" line the brief description), a
comment on a line of its own documents what follows it, and a comment after
a declaration on the same line documents that declaration.

usage: doxygen_filter.py HEADER   (writes the filtered text to stdout)
"""
import re
import sys

TRAILING = re.compile(r"^(\s*\S.*?[;,{])(\s*)/\*(?![*!])")
LEADING = re.compile(r"^(\s*)/\*(?![*!])")
TITLE = re.compile(r"^\s*\*\s*([A-Za-z0-9_]+\.h)\s+--\s+(.*)$")
ANGLE = re.compile(r"<([A-Za-z_][^<>\s]*)>")
QUOTED_ANGLE = re.compile(r'"([^"\s]*<[^"\s]*)"')
DUNDER = re.compile(r"__([A-Za-z0-9]+)__")


def main(path):
    out = []
    in_comment = False
    first = True
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for line in lines:
        if not in_comment:
            m = LEADING.match(line)
            if m:
                if first:
                    line = m.group(1) + "/** @file" + line[m.end():]
                else:
                    line = m.group(1) + "/**" + line[m.end():]
            else:
                line = TRAILING.sub(r"\1\2/**<", line, count=1)
            if "/*" in line and "*/" not in line.split("/*", 1)[1]:
                in_comment = True
            if line.strip() and not line.strip().startswith(("/*", "*", "//")):
                first = False
            out.append(line)
            continue
        # inside a comment: the title line gives the brief description;
        # <name> in prose is text, not an HTML tag, and __metadata__ a
        # name, not markdown's bold
        if first:
            t = TITLE.match(line)
            if t:
                line = " * @brief " + t.group(2)
        if not re.match(r"^\s*\*\s{4,}", line):
            line = QUOTED_ANGLE.sub(r'`"\1"`', line)  # Doxygen keeps "..." verbatim
            parts = line.split("`")  # outside code spans, <name> as entities
            line = "`".join(ANGLE.sub(r"&lt;\1&gt;", t) if i % 2 == 0 else t for i, t in enumerate(parts))
            line = DUNDER.sub(r"\\_\\_\1\\_\\_", line)
        if "*/" in line:
            in_comment = False
            first = False
        out.append(line)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
