"""Product code states contracts, not history: no dates or commit hashes in docstrings or comments.

The history of a value (the run that found it, the commit it was measured on) belongs in git and
in docs/benchmarks.md; a docstring says what the code promises and, in a sentence, why.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PRODUCT = ("tuner", "objectives", "storage")

DATE = re.compile(r"\b(?:19|20)\d{2}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b")
"""A calendar date written YYYY-MM-DD."""

HEX_WORD = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
"""A lower-case hex word as long as a short or full git hash (7 to 40 characters)."""


def commit_hashes(text: str) -> list[str]:
    """Words of ``text`` that look like commit hashes: 7-40 hex digits with both a digit and a
    letter (so ``1073741824`` and ``deadbeef``-free English such as ``defaced`` pass), not part
    of a longer hex run (a sha256 digest is 64)."""
    return [
        word
        for word in HEX_WORD.findall(text)
        if re.search(r"[0-9]", word) and re.search(r"[a-f]", word)
    ]


def prose(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a module's ``source``, each with its first line number
    (docstrings: every string that stands alone as a statement, attribute docstrings included)."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.append((node.lineno, node.value.value))
    return found


def history(source: str) -> list[str]:
    """Each date or hash-looking word in ``source``'s comments and docstrings, as ``line: word``."""
    return [
        f"{line}: {word}"
        for line, text in sorted(prose(source))
        for word in DATE.findall(text) + commit_hashes(text)
    ]


def _modules() -> list[Path]:
    return sorted(path for package in PRODUCT for path in (ROOT / package).rglob("*.py"))


def test_the_check_finds_dates_and_hashes_and_nothing_else() -> None:
    source = '''"""Measured 2026-12-05 on ``c5208cf``."""
X = 1  # fitted at 4ef38bc6a02a53
Y = "2026-12-05 abc1234"  # a value, not prose
"""cgroup v1 writes 9223372036854771712; a sha256 is
9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08; 0xff, 1.5GiB, decade."""
'''
    assert history(source) == ["1: 2026-12-05", "1: c5208cf", "2: 4ef38bc6a02a53"]


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_product_module_carries_no_history(path: Path) -> None:
    found = history(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} dates or hashes: {found}"
