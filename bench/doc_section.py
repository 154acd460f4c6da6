"""Writes a generated section into docs/BENCHMARKS.md between its begin/end markers (shared by the
bench report scripts); a new section goes in front of the harness's section."""
import os
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "BENCHMARKS.md")


def write_section(text, begin, end, doc_path=DOC, at_end=False):
    """Replaces the text between `begin` and `end` (markers included) with `text`. Where the
    markers are not there yet, the section goes in front of the harness's section, or (`at_end`)
    at the end of the document."""
    with open(doc_path) as f:
        doc = f.read()
    if begin in doc:
        a, b = doc.index(begin), doc.index(end) + len(end)
        doc = doc[:a] + text + doc[b:]
    else:
        marker = "<!-- harness:begin -->"
        if at_end:
            doc = doc.rstrip("\n") + "\n\n" + text + "\n"
        elif marker in doc:
            doc = doc.replace(marker, text + "\n\n" + marker)
        else:
            doc = doc + "\n" + text + "\n"
    with open(doc_path, "w") as f:
        f.write(doc)


def spread(values, digits=1):
    """Median, and the range in parentheses when there is more than one value ("-" for none)."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = statistics.median(values)
    if len(values) == 1:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def publish(text, begin, end, quick, doc_path, log, at_end=False):
    """A bench script's last step: a `--quick` run's section is printed (unless a document was
    named), any other is written into the document (default docs/BENCHMARKS.md)."""
    if quick and not doc_path:
        print(text)
        log("--quick: section printed above, not written into the doc")
        return
    doc_path = doc_path or DOC
    write_section(text, begin, end, doc_path, at_end=at_end)
    log(f"rendered into {doc_path}")
