"""The documentation holds together: every relative link and anchor resolves, the README stays a
short page that starts with the run and the test commands, docs/performance.md stays within the
contract's 250 lines, and the README's command-line lines work when pasted into a shell with no
terminal."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from layering import service_files

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs" / "bench").glob("*.md"))]
PERFORMANCE_LINES = 250  # the contract's limit for docs/performance.md; the full text goes to docs/bench/
RUN_COMMAND = "python -m pip install -r requirements.txt && python app.py"
TEST_COMMAND = "python -m pip install -r requirements-dev.txt && python -m pytest"

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target), the target up to a space or the closing parenthesis.
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text):
    """The page without its code, where a bracket or a URL is an example, not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading):
    """The anchor GitHub makes for a heading: its text in lower case, punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path):
    """The anchors of a page: its headings' (-1, -2 ... for repeats) and its id and name attributes."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    found, seen = set(), {}
    for heading in HEADING.findall(text):
        made = slug(heading)
        found.add(made if made not in seen else f"{made}-{seen[made]}")
        seen[made] = seen.get(made, 0) + 1
    found.update(re.findall(r"<[^>]+\s(?:id|name)=\"([^\"]+)\"", text))
    return found


def links(path):
    text = prose(path.read_text(encoding="utf-8"))
    return MARKDOWN_LINK.findall(text) + HTML_LINK.findall(text)


def test_the_pages_exist_and_have_links():
    names = {page.name for page in PAGES}
    assert {"README.md", "SECURITY.md", "configuration.md", "deploying.md", "scaling.md", "operations.md",
            "security.md", "performance.md", "development.md", "web-app-and-keys.md"} <= names
    assert len(links(ROOT / "README.md")) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto: and the like are not checked here
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading or id makes the anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)} has broken links: {broken}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(ROOT / "README.md")}
    unlinked = [page.name for page in (ROOT / "docs").glob("*.md") if page.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    assert (ROOT / "SECURITY.md").resolve() in linked


def test_every_benchmark_page_is_linked_from_performance():
    performance = ROOT / "docs" / "performance.md"
    linked = {(performance.parent / target.partition("#")[0]).resolve() for target in links(performance)}
    unlinked = [page.name for page in (ROOT / "docs" / "bench").glob("*.md") if page.resolve() not in linked]
    assert not unlinked, f"docs/bench pages docs/performance.md does not link: {unlinked}"


def test_performance_stays_a_short_page():
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= PERFORMANCE_LINES, (
        f"docs/performance.md has {len(lines)} lines; keep a summary there and move the full text to docs/bench/")
    assert lines[0] == "# Performance" and "## Headline figures" in lines[:10]


def test_every_image_in_docs_is_shown_somewhere():
    shown = {(page.parent / target).resolve() for page in PAGES for target in links(page)}
    images = [path for path in (ROOT / "docs").rglob("*.png")]
    assert images
    unshown = [str(path.relative_to(ROOT)) for path in images if path.resolve() not in shown]
    assert not unshown, f"images no page shows: {unshown}"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into docs/"
    commands = [line.split("#")[0].strip() for line in lines[1:] if line.strip()][:2]
    assert commands == [RUN_COMMAND, TEST_COMMAND]


@pytest.mark.parametrize("heading, anchor", [
    ("The time socket's query-string key", "the-time-sockets-query-string-key"),
    ("Deploying to a PaaS", "deploying-to-a-paas"),
    ("`GET /metrics` and `/readyz`", "get-metrics-and-readyz"),
    ("Scaling: the key cache", "scaling-the-key-cache"),
    ("[SECURITY.md](../SECURITY.md) in short", "securitymd-in-short"),
])
def test_anchors_are_made_as_github_makes_them(heading, anchor):
    assert slug(heading) == anchor


def layout_table():
    """docs/development.md's layout table: each row's first cell and its second, as written."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    table = text.split("| file or folder | owns |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    return [row.strip("|").split(" | ", 1) for row in table.splitlines()]


def modules_the_layout_names():
    """The files the layout table names: a row's own files, and for a folder's row (`web/`) the
    modules its second cell names bare (`pages.py`), in that folder."""
    named = set()
    for first, owns in layout_table():
        for name in re.findall(r"`([^`]+)`", first):
            named.add(name)
            if name.endswith("/"):
                named.update(name + module for module in re.findall(r"`([\w.]+\.py)`", owns))
    return named


def test_the_layout_table_names_every_module_of_the_service_and_no_other():
    named = modules_the_layout_names()
    modules = {str(path.relative_to(ROOT)) for path in service_files() if path.name != "__init__.py"}
    unnamed = sorted(modules - named)
    absent = sorted(name for name in named if not (ROOT / name).exists())
    assert not unnamed and not absent, (
        "docs/development.md's layout table does not match the tree:\n"
        f"  modules it does not name: {unnamed}\n  names it gives that are no file or folder: {absent}")


def readme_block(containing):
    """The README's fenced code block that holds the text, as it stands."""
    [block] = [block for block in FENCE.findall((ROOT / "README.md").read_text(encoding="utf-8"))
               if containing in block]
    return block.split("\n", 1)[1].rsplit("```", 1)[0]


def run_shell(shell, script, tmp_path):
    """Run the script with `shell -e`, no terminal and no standard input, in the checkout, on a fresh database."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DATABASE_URL": f"sqlite:///{tmp_path}/readme.db", "SECRET_KEY": "test-secret-of-the-readme-lines-4b8e1d",
           "FLASK_SKIP_DOTENV": "1"}
    return subprocess.run([shell, "-e", "-c", script], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_readmes_user_and_key_lines_work_pasted_without_a_terminal(shell, tmp_path):
    lines = readme_block("users create")
    result = run_shell(shell, lines + 'flask --app app keys list alice\nprintf "KEY=%s\\n" "$KEY"\n', tmp_path)
    assert result.returncode == 0, result.stderr
    key = result.stdout.splitlines()[-1].removeprefix("KEY=")
    assert re.fullmatch(r"sk_test_[A-Za-z0-9]{38}", key), result.stdout
    listed = result.stdout.splitlines()[-2].split("\t")
    assert listed[1:4] == ["laptop", "development", key[:12] + "..."]


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_readmes_key_line_fails_loudly_when_the_key_is_not_made(shell, tmp_path):
    [key_line] = [line for line in readme_block("users create").splitlines() if line.startswith("KEY=")]
    result = run_shell(shell, key_line + '\necho "went on with KEY=$KEY"\n', tmp_path)
    assert result.returncode == 1
    assert "went on" not in result.stdout
    assert "There is no user named 'alice'." in result.stderr
