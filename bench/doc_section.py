"""Writes a generated section into bench/results/DETAILS.md between its begin/end markers (shared
by the bench report scripts); a new section goes in front of the harness's section. Writing into
the default document also regenerates docs/BENCHMARKS.md (`bench/benchmarks_doc.py`) from the
results files."""
import os
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "bench", "results", "DETAILS.md")


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
    if os.path.abspath(doc_path) == os.path.abspath(DOC):
        regenerate_summary()


def regenerate_summary():
    """Rewrites docs/BENCHMARKS.md from the committed results files. A results file it cannot
    read is reported (the summary is then left as it was), not hidden."""
    from bench import benchmarks_doc  # here, not at the top: benchmarks_doc imports bench scripts

    try:
        benchmarks_doc.main([])
    except (OSError, KeyError, ValueError, TypeError) as e:
        print(f"docs/BENCHMARKS.md not regenerated ({type(e).__name__}: {e}); "
              "run python3 bench/benchmarks_doc.py to see why")


def spread(values, digits=1):
    """Median, and the range in parentheses when there is more than one value ("-" for none)."""
    return span(values, f"{{:.{digits}f}}")


def publish(text, begin, end, quick, doc_path, log, at_end=False):
    """A bench script's last step: a `--quick` run's section is printed (unless a document was
    named), any other is written into the document (default bench/results/DETAILS.md)."""
    if quick and not doc_path:
        print(text)
        log("--quick: section printed above, not written into the doc")
        return
    doc_path = doc_path or DOC
    write_section(text, begin, end, doc_path, at_end=at_end)
    log(f"rendered into {doc_path}")


def med(values):
    """The median of the values present (None for none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def span(values, fmt="{:.2f}"):
    """The median of the values present with their range, `m (lo–hi)` ("-" for none)."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = statistics.median(values)
    if len(values) == 1:
        return fmt.format(m)
    return f"{fmt.format(m)} ({fmt.format(min(values))}–{fmt.format(max(values))})"
