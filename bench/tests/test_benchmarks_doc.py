"""docs/BENCHMARKS.md is exactly what bench/benchmarks_doc.py writes from the committed results
files (so no number in it can drift from its results file), and it stays under 400 lines."""
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import benchmarks_doc  # noqa: E402


class BenchmarksDocTest(unittest.TestCase):
    def test_committed_doc_is_the_generators_output(self):
        with open(benchmarks_doc.DOC) as f:
            committed = f.read()
        self.assertEqual(committed, benchmarks_doc.render(),
                         "docs/BENCHMARKS.md differs: run python3 bench/benchmarks_doc.py")

    def test_doc_is_under_400_lines(self):
        self.assertLess(benchmarks_doc.render().count("\n"), 400)

    def test_every_results_file_it_names_exists(self):
        for area in benchmarks_doc.AREAS:
            a = area()
            self.assertTrue(a.rows, f"{area.__name__}: no rows")
            for rel in a.files:
                self.assertTrue(os.path.isfile(os.path.join(ROOT, rel)), rel)

    def test_every_command_runs_a_script_that_exists(self):
        for area in benchmarks_doc.AREAS:
            a = area()
            words = a.command.split()
            scripts = [w for w in words if w.endswith(".py")]
            modules = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]
            self.assertTrue(scripts or modules, f"{area.__name__}: {a.command}")
            for w in scripts:
                self.assertTrue(os.path.isfile(os.path.join(ROOT, w)), f"{area.__name__}: {w}")
            for m in modules:
                path = os.path.join(ROOT, *m.split("."))
                self.assertTrue(os.path.isdir(path) or os.path.isfile(path + ".py"), m)


if __name__ == "__main__":
    unittest.main()
