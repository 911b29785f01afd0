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


def test_the_references_are_rendered_from_the_code(tmp_path: Path) -> None:
    """The API and configuration references are the models themselves: every row with its
    route and each of its parameters, every key of capd.toml, in the built site."""
    from capd.sidecar._args import params_of
    from capd.sidecar._table import COMMANDS
    from capd.sidecar.server._config import CapdConfig, McpHttpConfig

    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        import reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "_hooks"))
    api, config = reference.api_reference(), reference.config_reference()
    for row in COMMANDS:
        assert f"`{row.method} {row.path}`" in api, row.id
        for param in params_of(row.params):
            assert f"| `{param.name}`" in api, (row.id, param.name)
    for name in CapdConfig.model_fields:
        assert f"| `{name}` |" in config or f"`[{name}]`" in config, name
    http = config.split("#### `[mcp.http]`")[1].split("####")[0]
    for name in McpHttpConfig.model_fields:
        assert f"| `{name}` |" in http, name
    assert "#### `[[peers]]`" in config
    assert "#### `[profiles.NAME]`" in config
    assert "| `limit` (`--limit`) | query `limit` | int | `100` | ≥ 1, ≤ 1000 |" in api
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site"), "--config-file", str(ROOT / "mkdocs.yml")],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "invoke_capability" in page
    assert "capd:api" not in page
    settings = (tmp_path / "site" / "config-reference" / "index.html").read_text()
    assert "queue_retention_s" in settings
