"""report.html: report.md converted by markdown-it-py (CommonMark with tables), so the two cannot
drift apart, as one self-contained page: styled inline, every figure embedded as a data URI, no
file or network reference left. report.md's only raw HTML is its <details> folds (table cells
are escaped, analysis/text.py); headings get GitHub's anchors, so the contents' links work. Each
figure is shown at its drawn size (IMAGE_PX_PER_INCH), so text reads the same size in every
figure; wide tables scroll sideways instead of running past the page."""
from __future__ import annotations

import base64
import html
from collections.abc import Mapping

from markdown_it import MarkdownIt

from analysis.plots import STYLE as FIGURE_STYLE
from analysis.text import slugs

# CSS pixels per inch of figure: the PNGs (savefig.dpi pixels per inch) are shown at this scale,
# so a figure's 9 pt text reads as about 12.5 px wherever it is, sharp on high-density screens; a
# figure wider than the page (72rem at 100 px per inch: 11.5 inches) is scaled down to fit.
IMAGE_PX_PER_INCH = 100

STYLE = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem;display:block;max-width:100%;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}th{background:#f2f2f2}
code{background:#f4f4f4;padding:0 .2rem}img{max-width:100%;height:auto}h1,h2{border-bottom:1px solid #ddd}
blockquote{border-left:4px solid #c33;margin:.5rem 0;padding:.1rem .8rem;background:#fff5f5}
details{margin:.4rem 0}summary{cursor:pointer;font-weight:600}"""


def _shown_width(png: bytes) -> int:
    """The CSS width of a PNG at IMAGE_PX_PER_INCH: its pixel width (in the IHDR chunk, bytes
    16-19) over the figures' savefig.dpi."""
    return round(int.from_bytes(png[16:20], "big") * IMAGE_PX_PER_INCH / FIGURE_STYLE["savefig.dpi"])


def render_html(markdown: str, images: Mapping[str, bytes]) -> str:
    """`markdown` (report.md) as one page; `images` maps each image path it links to (relative to
    the report) to its PNG bytes."""
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    tokens = md.parse(markdown)
    headings = [(token, tokens[i + 1].content) for i, token in enumerate(tokens) if token.type == "heading_open"]
    for (token, _), slug in zip(headings, slugs([title for _, title in headings])):
        token.attrSet("id", slug)
    for token in tokens:
        for child in token.children or []:
            if child.type == "image":
                src = str(child.attrGet("src"))
                if src not in images:
                    raise ValueError(f"report.html would reference {src!r}, which is not embedded")
                child.attrSet("src", "data:image/png;base64," + base64.b64encode(images[src]).decode())
                child.attrSet("width", str(_shown_width(images[src])))
    title = next((line.lstrip("#").strip().replace("`", "") for line in markdown.splitlines()
                  if line.startswith("# ")), "report")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>\n{STYLE}\n</style>\n</head>\n<body>\n"
            f"{md.renderer.render(tokens, md.options, {})}</body>\n</html>\n")
