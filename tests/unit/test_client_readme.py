"""The README's SDK examples are exactly the files the e2e tests run (tests/e2e/examples/); its shell examples
(the CLI and MCP ones included) are run straight from README.md by tests/e2e/test_readme.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "tests" / "e2e" / "examples"
LANGUAGES = {".sh": "sh", ".py": "python"}


@pytest.mark.parametrize("name", ["sdk_async.py", "sdk_sync.py"])
def test_readme_shows_the_example_that_the_e2e_tests_run(name: str) -> None:
    """The README holds the example file verbatim as one fenced code block, so the printed example is the tested
    one (test_sdk.py runs these files)."""
    example = EXAMPLES / name
    block = f"```{LANGUAGES[example.suffix]}\n{example.read_text()}```\n"
    assert block in (ROOT / "README.md").read_text(), f"README.md does not show {example.relative_to(ROOT)} verbatim"
