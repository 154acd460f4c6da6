"""bench/results/DETAILS.md holds each bench script's generated section exactly as the script
renders it from its committed results file, so no number there drifts from its file either."""
import json
import os
import shutil
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import codec, corun, defaults, fork, micro, pool, prefetch_report  # noqa: E402
from bench import programs, spawn, vs_swap, wakeup  # noqa: E402
from bench.doc_section import DOC  # noqa: E402


def load(name):
    with open(os.path.join(ROOT, "bench", "results", name)) as f:
        return json.load(f)


def committed():
    with open(DOC) as f:
        return f.read()


def section(text, begin, end):
    a, b = text.index(begin), text.index(end) + len(end)
    return text[a:b]


class DetailsDocTest(unittest.TestCase):
    def assert_section(self, module, text):
        doc = committed()
        self.assertIn(module.BEGIN, doc, module.__name__)
        self.assertEqual(section(doc, module.BEGIN, module.END), text.strip("\n"),
                         f"{module.__name__}'s section of DETAILS.md differs from its renderer")

    def test_sections_rendered_from_one_results_file(self):
        cases = [
            (codec, lambda: codec.render_text(load("codec.json"), "bench/results/codec.json")),
            (vs_swap, lambda: vs_swap.render_text(load("vs-swap.json"),
                                                  "bench/results/vs-swap.json")),
            (spawn, lambda: spawn.render_text(load("spawn.json"))),
            (wakeup, lambda: wakeup.render_text(load("wakeup.json"))),
            (programs, lambda: programs.render_text(load("programs.json"))),
            (defaults, lambda: defaults.render_text(load("defaults.json"))),
            (prefetch_report, lambda: prefetch_report.section(load("prefetch.json"),
                                                              "bench/results/prefetch.json")),
        ]
        for module, render in cases:
            with self.subTest(module.__name__):
                self.assert_section(module, render())

    def test_micro_sections(self):
        captured = []
        original = micro.write_section
        micro.write_section = lambda text, begin, end, *a, **k: captured.append(text)
        try:
            micro.render()
        finally:
            micro.write_section = original
        self.assertEqual(len(captured), 1)
        self.assert_section(micro, captured[0])

    def test_sections_written_by_render_into_a_document(self):
        for module, name in ((fork, "fork.json"), (pool, "pool.json"), (corun, "corun.json")):
            with self.subTest(module.__name__), tempfile.TemporaryDirectory() as tmp:
                doc = os.path.join(tmp, "DETAILS.md")
                shutil.copy(DOC, doc)
                module.render(load(name), doc, f"bench/results/{name}")
                with open(doc) as f:
                    self.assertEqual(f.read(), committed(), module.__name__)


if __name__ == "__main__":
    unittest.main()
