"""docs/decisions.md's sections, its topic index and every "decisions §N" citation in the repository agree, and the
decisions and architecture documents stay short enough to read."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DECISIONS = REPO / "docs" / "decisions.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAX_DECISIONS_LINES = 900
MAX_ARCHITECTURE_LINES = 700
# Where citations of the decisions are looked for: files with these suffixes under these folders, and README.md.
CITING_FOLDERS = ("docs", "seq2seq_engine", "kernels", "models", "tests", "benchmarks", "scripts", "examples")
CITING_SUFFIXES = (".py", ".md", ".sh", ".txt", ".cfg", ".toml")

SECTION = re.compile(r"^## (\d+)\. ", re.M)
# One section number or a range of them: "§12", "§47–§57", "§47-57".
REF = r"§\d+(?:\s*[–-]\s*§?\d+)?"
# "decisions §N", "decisions.md §N", "`docs/decisions.md` §N", "Decisions §N, §M and §K–§L" (across a line break too).
CITATION = re.compile(rf"decisions(?:\.md)?`?\s*({REF}(?:\s*(?:,|and|or)\s*{REF})*)", re.I)
NUMBERS = re.compile(r"§(\d+)(?:\s*[–-]\s*§?(\d+))?")
# Inside docs/decisions.md: a list of references, with the document it names when it names one.
OWN_REFS = re.compile(rf"(?:([\w./-]+\.md)`?\s*)?({REF}(?:\s*(?:,|and|or)\s*{REF})*)")


def _expand(refs: str) -> list:
    """The section numbers a list of references names, ranges expanded."""
    numbers = []
    for first, last in NUMBERS.findall(refs):
        low, high = int(first), int(last or first)
        assert low <= high, f"a backwards range of sections: {refs!r}"
        numbers.extend(range(low, high + 1))
    return numbers


def _decisions() -> str:
    return DECISIONS.read_text(encoding="utf-8")


def _sections() -> list:
    return [int(number) for number in SECTION.findall(_decisions())]


def _index() -> set:
    """Every section number the topic index (the text before the first section) names, ranges expanded."""
    text = _decisions()
    first = SECTION.search(text)
    assert first, "docs/decisions.md has no '## N. ' section"
    return set(_expand(text[:first.start()]))


def _citing_files() -> list:
    files = [REPO / "README.md"]
    for folder in CITING_FOLDERS:
        files.extend(path for path in sorted((REPO / folder).rglob("*"))
                     if path.is_file() and path.suffix in CITING_SUFFIXES and "__pycache__" not in path.parts)
    return files


def _citations() -> list:
    """(file, line, section number) of every citation of the decisions in the repository, and of every bare §N
    inside docs/decisions.md itself, which cites its own sections so."""
    found = []
    for path in _citing_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if path == DECISIONS:
            for match in OWN_REFS.finditer(text):
                document = match.group(1)
                if document is None or document.endswith("decisions.md"):   # not "docs/performance.md §3"
                    line = text.count("\n", 0, match.start()) + 1
                    found.extend((path, line, number) for number in _expand(match.group(2)))
            continue
        for match in CITATION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.extend((path, line, number) for number in _expand(match.group(1)))
    return found


def test_section_numbers_are_unique_and_ascending():
    sections = _sections()
    assert sections, "docs/decisions.md has no sections"
    repeated = sorted(number for number in set(sections) if sections.count(number) > 1)
    assert not repeated, f"repeated section numbers: {repeated}"
    assert sections == sorted(sections), "the sections are not in ascending order"


def test_every_section_is_in_the_index():
    missing = sorted(set(_sections()) - _index())
    assert not missing, f"sections missing from the topic index of docs/decisions.md: {missing}"


def test_the_index_names_only_existing_sections():
    unknown = sorted(_index() - set(_sections()))
    assert not unknown, f"the topic index of docs/decisions.md names sections that do not exist: {unknown}"


def test_every_citation_names_an_existing_section():
    sections = set(_sections())
    dangling = [f"{path.relative_to(REPO)}:{line}: §{number}" for path, line, number in _citations()
                if number not in sections]
    assert not dangling, "citations of docs/decisions.md that name no section:\n" + "\n".join(dangling)


def test_citations_are_found():
    """The citation pattern still matches how the repository cites (a guard against a pattern that finds nothing)."""
    cited = {number for path, _, number in _citations() if path != DECISIONS}
    assert len(cited) >= 30, f"only {len(cited)} cited sections found: has the citation style changed?"


@pytest.mark.parametrize("text, numbers", [
    ("decisions §5", [5]),
    ("(`docs/decisions.md` §47–§57, §90)", list(range(47, 58)) + [90]),
    ("see docs/decisions.md §80.", [80]),
    ("Decisions §18, §20–§22, §27 give the reasons", [18, 20, 21, 22, 27]),
    ("why: `docs/decisions.md`\n§58–§61.", [58, 59, 60, 61]),
    ("decisions §30, §31): one pass", [30, 31]),
])
def test_the_citation_pattern(text, numbers):
    assert [n for match in CITATION.finditer(text) for n in _expand(match.group(1))] == numbers


def test_decisions_is_at_most_900_lines():
    lines = len(_decisions().splitlines())
    assert lines <= MAX_DECISIONS_LINES, f"docs/decisions.md has {lines} lines, more than {MAX_DECISIONS_LINES}"


def test_architecture_is_at_most_700_lines():
    lines = len(ARCHITECTURE.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_ARCHITECTURE_LINES, \
        f"docs/architecture.md has {lines} lines, more than {MAX_ARCHITECTURE_LINES}"
