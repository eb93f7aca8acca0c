"""Checks a page written by `ampc report` against the metrics files it drew.

usage:
  python3 report_check.py page PAGE.html METRICS.jsonl [MORE.jsonl ...]
      the page is self-contained (no network, no executable script) and every
      chart's data -- the SVG lines' data-x / data-y, the skipped-step marks,
      the memory bars' data-bytes, and the JSON data block -- equal the values
      in the metrics files, run by run in the order given
  python3 report_check.py png SCREENSHOT.png
      the screenshot is not blank: enough non-white pixels, and the first two
      runs' colours present (the charts' lines), decoded with zlib alone
Prints one line per check ("ok ..." / "FAIL ..."); exits 1 if any failed.
"""
import json
import math
import re
import struct
import sys
import zlib
from html.parser import HTMLParser

failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures += 1


def nums(s):
    return [float(v) for v in s.split(",")] if s else []


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.lines, self.marks, self.bars, self.scripts, self.tags = [], [], [], [], []
        self._script = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "polyline" and "data-series" in a:
            self.lines.append(a)
        elif tag == "g" and a.get("class") == "marks":
            self.marks.append(a)
        elif tag == "rect" and a.get("class") == "mem":
            self.bars.append(a)
        elif tag == "script":
            self._script = {"attrs": a, "text": ""}

    def handle_data(self, data):
        if self._script is not None:
            self._script["text"] += data

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append(self._script)
            self._script = None


def read_metrics(path):
    epochs, steps = {}, {}
    for line in open(path):
        if not line.strip():
            continue
        o = json.loads(line)
        if "epoch" in o:
            epochs[o["epoch"]] = o
        elif "step" in o:
            steps[o["step"]] = o
    return [epochs[k] for k in sorted(epochs)], [steps[k] for k in sorted(steps)]


def series(page, run, name):
    found = [l for l in page.lines if l["data-run"] == str(run) and l["data-series"] == name]
    return (nums(found[0]["data-x"]), nums(found[0]["data-y"])) if found else None


def expect_line(page, run, name, xs, ys, label):
    got = series(page, run, name)
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    want = ([p[0] for p in pts], [p[1] for p in pts])
    check(got == want, f"run {run} {label}: the line's data equal the metrics ({len(pts)} points)"
          + ("" if got == want else f"; page {got}, metrics {want}"))


def check_page(path, metrics):
    html = open(path, encoding="utf-8").read()
    page = Page()
    page.feed(html)
    # self-contained: nothing fetched, nothing to run
    fetch = re.findall(r'(?:src|href)\s*=|https?://|@import|url\(|<link|<iframe|<img', html, re.I)
    check(not fetch, "self-contained: no src/href, URLs, @import, url() or <link>" + (f" (found {fetch[:3]})" if fetch else ""))
    exe = [s for s in page.scripts if s["attrs"].get("type") != "application/json"]
    check(not exe, "no executable script: the charts are plain SVG")
    check(sum(1 for t, _ in page.tags if t == "svg") >= 6, "at least 6 SVG charts")
    blocks = [s for s in page.scripts if s["attrs"].get("id") == "ampc-report-data"]
    check(len(blocks) == 1, "one <script type=application/json id=ampc-report-data> block")
    data = json.loads(blocks[0]["text"]) if blocks else {"runs": [], "charts": []}
    check([r["file"] for r in data["runs"]] == metrics, "the data block lists the runs in order: " + ", ".join(metrics))

    for run, path_m in enumerate(metrics):
        epochs, steps = read_metrics(path_m)
        ep = [e["epoch"] for e in epochs]
        check(path_m in html and (epochs[0].get("opt_level", "") in html), f"run {run}: the legend names {path_m} and its opt level")
        for key, label in (("train_loss", "train loss"), ("test_loss", "test loss"), ("test_acc", "test accuracy"),
                           ("images_per_s", "images/s")):
            expect_line(page, run, key, ep, [e.get(key) for e in epochs], label)
        if any("grad_underflow_fraction" in e for e in epochs):
            expect_line(page, run, "grad_underflow_fraction", ep, [e.get("grad_underflow_fraction") for e in epochs], "gradient underflow share")
        if steps:
            expect_line(page, run, "step_loss_scale", [s["step"] for s in steps], [s.get("loss_scale") for s in steps], "loss scale per step")
            expect_line(page, run, "step_loss", [s["step"] for s in steps], [s.get("loss") for s in steps], "loss per step")
            skipped = [float(s["step"]) for s in steps if s.get("skipped")]
            m = [a for a in page.marks if a["data-run"] == str(run) and a["data-series"] == "step_loss_scale_skipped"]
            check(nums(m[0]["data-x"]) == skipped if m else skipped == [], f"run {run}: skipped steps marked at {skipped}")
        else:
            expect_line(page, run, "loss_scale", [e["steps"] for e in epochs], [e.get("loss_scale") for e in epochs], "loss scale per epoch")
            expect_line(page, run, "lr", [e["steps"] for e in epochs], [e.get("lr") for e in epochs], "learning rate")
            skipped = [(float(e["steps"]), float(e["skipped_steps"])) for e in epochs if e.get("skipped_steps")]
            m = [a for a in page.marks if a["data-run"] == str(run) and a["data-series"] == "loss_scale_skipped"]
            got = list(zip(nums(m[0]["data-x"]), nums(m[0]["data-count"]))) if m else []
            check(got == skipped, f"run {run}: epochs with skipped steps marked: {skipped}")
        mem = epochs[-1].get("memory", {})
        want = {(c, t): v for c, d in mem.items() if isinstance(d, dict) for t, v in d.items() if t != "total"}
        got = {(b["data-category"], b["data-dtype"]): int(b["data-bytes"]) for b in page.bars if b["data-run"] == str(run)}
        check(got == want and len(want) > 0, f"run {run}: memory bars equal the metrics ({len(want)} category/type pairs)")
        rec = data["runs"][run]["records"] if run < len(data["runs"]) else []
        check([r for r in rec if "epoch" in r] == epochs, f"run {run}: the data block holds the epoch records as written")
    # every chart's series in the data block match the SVG lines
    same = all(series(page, s["run"], s["name"]) == (s["x"], s["y"]) for c in data["charts"] for s in c["series"] if s["x"])
    check(same and data["charts"], "the data block's chart series equal the SVG lines'")


def png_pixels(path):
    raw = open(path, "rb").read()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", 0
    while pos < len(raw):
        n, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        body = raw[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, f"unsupported PNG (depth {depth}, type {ctype})"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    data, stride, prev, rows = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
    for y in range(h):
        f, line = data[y * (stride + 1)], bytearray(data[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def check_png(path):
    w, h, bpp, rows = png_pixels(path)
    total = w * h
    nonwhite, near = 0, [0, 0]
    colours = [(0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e)]  # the first two runs' colours
    for row in rows:
        for i in range(0, len(row), bpp):
            r, g, b = row[i], row[i + 1], row[i + 2]
            if r < 235 or g < 235 or b < 235:
                nonwhite += 1
            for k, (cr, cg, cb) in enumerate(colours):
                if abs(r - cr) + abs(g - cg) + abs(b - cb) < 40:
                    near[k] += 1
    share = nonwhite / total
    check(w >= 800 and h >= 800, f"screenshot {w}x{h}")
    check(share > 0.03, f"screenshot not blank: {100 * share:.1f}% of the pixels are not white")
    check(near[0] > 300 and near[1] > 300, f"the runs' line colours are drawn: {near[0]} and {near[1]} pixels")


if __name__ == "__main__":
    if sys.argv[1] == "page":
        check_page(sys.argv[2], sys.argv[3:])
    else:
        check_png(sys.argv[2])
    sys.exit(1 if failures else 0)
