"""The project stands on its own: code, tests, benchmarks and docs cite only the project's
docs/, and every citation of a docs page's section names a heading that page has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("gpuprof_jupyter", "tests", "benchmarks", "docs")
SUFFIXES = {".py", ".md", ".ts", ".tsx", ".toml"}
# docs/facts.md, "Exported pages" (the heading may wrap onto the next line of a comment)
CITATION = re.compile(r'docs/(\w+)\.md,\s*"([^"]+)"')


def _files():
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and not {"node_modules", "static", "lib"} & set(path.parts):
                yield path


def test_no_citation_of_a_design_file_outside_the_repository():
    here = Path(__file__).name
    found = [f"{path.relative_to(ROOT)}:{n}" for path in _files() if path.name != here
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if re.search(r"\bDESIGN\b|DESIGN\.md|STYLE\.md|/work/shared", line)]
    assert not found, found


def test_every_cited_docs_section_exists():
    headings: dict[str, set[str]] = {}
    for page in (ROOT / "docs").glob("*.md"):
        headings[page.stem] = {re.sub(r"^\d+\.\s*", "", line.lstrip("#").strip())
                               for line in page.read_text().splitlines() if line.startswith("#")}
    wrong = []
    for path in _files():
        text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text(errors="replace"))  # a citation may wrap
        for page, section in CITATION.findall(text):
            section = section.rstrip(".")
            if page not in headings or section not in headings[page]:
                wrong.append(f"{path.relative_to(ROOT)}: docs/{page}.md, {section!r}")
    assert not wrong, wrong
