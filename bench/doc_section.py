"""Writes a generated section into docs/BENCHMARKS.md between its begin/end markers (shared by the
bench report scripts); a new section goes in front of the harness's section."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "BENCHMARKS.md")


def write_section(text, begin, end, doc_path=DOC):
    """Replaces the text between `begin` and `end` (markers included) with `text`."""
    with open(doc_path) as f:
        doc = f.read()
    if begin in doc:
        a, b = doc.index(begin), doc.index(end) + len(end)
        doc = doc[:a] + text + doc[b:]
    else:
        marker = "<!-- harness:begin -->"
        doc = doc.replace(marker, text + "\n\n" + marker) if marker in doc else doc + "\n" + text + "\n"
    with open(doc_path, "w") as f:
        f.write(doc)
