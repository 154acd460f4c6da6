"""Every reference in README.md and docs/ resolves inside the repository: each relative markdown
link and each backticked path that names a repository file or directory exists, and nothing
points outside the repository (`../`, `shared/`, `ALGORITHMS.md`)."""
import glob
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# A backticked token is taken for a repository path when it starts with one of these.
TOP = ("crates/", "bench/", "docs/", "scripts/", "tests/", "include/", "python/", "serve/",
       "fuzz/", "README.md", "Makefile", "Cargo.toml")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")


def documents():
    return [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))


def references(path):
    with open(path) as f:
        text = f.read()
    links = [m for m in LINK.findall(text) if not re.match(r"[a-z]+:", m) and not
             m.startswith("#")]
    paths = [c.rstrip(".,;:") for c in CODE.findall(text) if c.startswith(TOP)]
    return text, links, paths


class DocLinksTest(unittest.TestCase):
    def test_relative_links_resolve(self):
        missing = []
        for doc in documents():
            _, links, _ = references(doc)
            for link in links:
                target = os.path.normpath(os.path.join(os.path.dirname(doc), link.split("#")[0]))
                if not os.path.exists(target) or not target.startswith(ROOT):
                    missing.append(f"{os.path.relpath(doc, ROOT)}: {link}")
        self.assertEqual(missing, [])

    def test_backticked_repository_paths_exist(self):
        missing = []
        for doc in documents():
            _, _, paths = references(doc)
            for p in paths:
                # A pattern (`bench/results/harness-50-*`), a placeholder (`FILE`, `N`) or a
                # command line with arguments names no single file.
                if any(ch in p for ch in "*{}<>|") or re.search(r"[A-Z]{2,}\b|-N\b", p):
                    continue
                if not os.path.exists(os.path.join(ROOT, p.split("#")[0].split(":")[0])):
                    missing.append(f"{os.path.relpath(doc, ROOT)}: {p}")
        self.assertEqual(missing, [])

    def test_nothing_points_outside_the_repository(self):
        bad = []
        for doc in documents():
            text, _, _ = references(doc)
            for word in ("../", "shared/", "ALGORITHMS.md"):
                if word in text:
                    bad.append(f"{os.path.relpath(doc, ROOT)}: {word}")
        self.assertEqual(bad, [])


class SourceCommentsTest(unittest.TestCase):
    """The docs, results and scripts that comments in the Rust sources cite exist too."""

    CITED = re.compile(r"\b((?:docs|bench/results|bench|scripts)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")

    def sources(self):
        return sorted(glob.glob(os.path.join(ROOT, "crates", "**", "*.rs"), recursive=True))

    def test_paths_cited_in_rust_comments_exist(self):
        missing, seen = [], 0
        for src in self.sources():
            with open(src) as f:
                for n, line in enumerate(f, 1):
                    if "//" not in line:
                        continue
                    for p in self.CITED.findall(line[line.index("//"):]):
                        seen += 1
                        if any(ch in p for ch in "*{}<>") or not os.path.exists(
                                os.path.join(ROOT, p)):
                            missing.append(f"{os.path.relpath(src, ROOT)}:{n}: {p}")
        self.assertGreater(seen, 10, "the comments cite docs and results: the scan found none")
        self.assertEqual(missing, [])

    def test_no_rust_comment_points_outside_the_repository(self):
        bad = []
        for src in self.sources():
            with open(src) as f:
                text = f.read()
            for word in ("shared/", "ALGORITHMS.md"):
                if word in text:
                    bad.append(f"{os.path.relpath(src, ROOT)}: {word}")
        self.assertEqual(bad, [])


class CrateTableTest(unittest.TestCase):
    def test_architecture_names_every_workspace_member_and_serve(self):
        with open(os.path.join(ROOT, "Cargo.toml")) as f:
            members = re.search(r"members\s*=\s*\[([^]]*)\]", f.read()).group(1)
        with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
            table = "\n".join(line for line in f if line.startswith("| `"))
        wanted = re.findall(r'"([^"]+)"', members) + ["serve/"]
        self.assertEqual([m for m in wanted if f"| `{m}`" not in table], [])


if __name__ == "__main__":
    unittest.main()
