"""Every citation of a section, `docs/NAME.md, "Heading"`, in the sources, tests and documents names
a heading that exists in that document (a heading starting with the quoted words)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITATION = re.compile(r'(docs/[A-Za-z_]+\.md)(?:,|\s)\s*\(?"([^"]+)"')


def citations(text: str) -> list[tuple[str, str]]:
    """(document, heading) for each citation; a citation may wrap across lines (and a comment's `#`)."""
    flat = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    return [(doc, " ".join(heading.split())) for doc, heading in CITATION.findall(flat)]


def headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in doc.read_text().splitlines() if line.startswith("#")]


def broken(root: Path = REPO) -> list[str]:
    files = [*root.glob("src/**/*.py"), *root.glob("tests/**/*.py"), *root.glob("docs/*.md"), root / "README.md"]
    wrong = []
    for path in (f for f in files if f.name != Path(__file__).name):  # this file's examples are not citations
        for doc, heading in citations(path.read_text()):
            target = root / doc
            if not target.is_file() or not any(h.startswith(heading) for h in headings(target)):
                wrong.append(f"{path.relative_to(root)}: {doc}, {heading!r}")
    return sorted(set(wrong))


def test_every_cited_section_exists():
    assert broken() == []


def test_a_citation_of_a_missing_heading_is_found(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A\n\n## Statistics\n")
    (tmp_path / "README.md").write_text('see docs/A.md, "Statistics" and docs/A.md,\n"Run directory: exact format"\n')
    assert broken(tmp_path) == ["README.md: docs/A.md, 'Run directory: exact format'"]
