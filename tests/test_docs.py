"""The documentation site builds without a warning (mkdocs --strict), every page is in its
navigation, and the README stays a short entrance that links into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers.servers import ROOT


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds: no broken link, no page left out of a build."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site"), "--config-file", str(ROOT / "mkdocs.yml")],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "policy" / "index.html").exists()


def test_every_page_is_in_the_navigation_and_the_readme_links_into_it() -> None:
    """Each docs/*.md is in mkdocs.yml's nav; the README (about 200 lines at most) links to
    each page it names, and each exists."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {next(iter(item.values())) for item in nav}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == listed
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\((docs/[^)]+)\)", readme):
        assert (ROOT / target).exists(), target
