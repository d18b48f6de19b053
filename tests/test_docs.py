"""The documentation site builds with ``mkdocs build --strict`` (every page in the nav, every link and anchor
resolves, every API reference names a real object), and the BUILT pages show what the sources mean: every
Markdown list is a list (Python-Markdown glues a list written right under a paragraph onto it, and flattens a
list nested by two spaces), and docstring examples are code blocks without doctest flags. The site is built
once per session (the ``site`` fixture)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIST_ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+\.)\s+(\S.*)$")
RUN_ON_ITEM = re.compile(r"\n\s*(?:[-*+]|\d+\.)\s")  # a list item's marker inside a paragraph's text
SNIPPET = re.compile(r'^--8<-- "([^":]+):([^"]+)"$')  # pymdownx.snippets: a named section of another file
DOC_PATH = re.compile(r"(?:docs/)?([\w-]+)\.md(?:#[\w-]*)?")  # docs/torch.md, torch.md#using-the-result
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE_LINE = re.compile(r"^\s*(```|~~~)")  # any line that Markdown may read as a code fence
OPENING_FENCE = re.compile(r"^(\s*)```[\w+-]*\s*$")  # ```python: a language, nothing else
CLOSING_FENCE = re.compile(r"^(\s*)```\s*$")  # nothing after the backticks, ever


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with --strict."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about its successor
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{done.stderr}")
    return out


class Article(HTMLParser):
    """The text of a page's content (the theme's navigation left out): each <li> with its nesting depth,
    each <p>, and the text inside and outside <pre>."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[tuple[int, str]] = []
        self.paragraphs: list[str] = []
        self.code = ""
        self.prose = ""
        self._open_items: list[int] = []
        self._paragraph: str | None = None
        self._in_article = self._in_pre = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_article |= tag == "article"
        if not self._in_article:
            return
        if tag == "li":
            self.items.append((len(self._open_items) + 1, ""))
            self._open_items.append(len(self.items) - 1)
        self._paragraph = "" if tag == "p" else self._paragraph
        self._in_pre |= tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self._in_article = False
        elif tag == "li" and self._open_items:
            self._open_items.pop()
        elif tag == "p" and self._paragraph is not None:
            self.paragraphs.append(self._paragraph)
            self._paragraph = None
        elif tag == "pre":
            self._in_pre = False

    def handle_data(self, data: str) -> None:
        if not self._in_article:
            return
        for k in self._open_items:
            self.items[k] = (self.items[k][0], self.items[k][1] + data)
        if self._paragraph is not None:
            self._paragraph += data
        if self._in_pre:
            self.code += data
        else:
            self.prose += data


class UnlinkedPaths(HTMLParser):
    """The doc paths of a page's content that are not links: ``docs/torch.md`` as plain text, or a code span
    that is nothing but a page's path (a code block's text and a link's are left alone)."""

    def __init__(self, pages: set[str]) -> None:
        super().__init__()
        self.pages = pages
        self.found: list[str] = []
        self._in_article = False
        self._open = {"a": 0, "pre": 0, "code": 0}
        self._code = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_article |= tag == "article"
        if tag in self._open:
            self._open[tag] += 1
            self._code = "" if tag == "code" else self._code

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self._in_article = False
        if tag in self._open and self._open[tag]:
            self._open[tag] -= 1
            if tag == "code" and self._in_article and not self._open["a"] and not self._open["pre"] and \
                    (match := DOC_PATH.fullmatch(self._code.strip())) and match[1] in self.pages:
                self.found.append(f"`{self._code.strip()}`")

    def handle_data(self, data: str) -> None:
        if not self._in_article or self._open["a"] or self._open["pre"]:
            return
        if self._open["code"]:
            self._code += data
        else:
            self.found += [m[0] for m in re.finditer(r"\bdocs/[\w-]+\.md\b", data)]


def article(path: Path) -> Article:
    parsed = Article()
    parsed.feed(path.read_text(encoding="utf-8"))
    return parsed


def page_lines(page: Path) -> list[str]:
    """A page's Markdown with the README sections it includes put in place."""
    lines: list[str] = []
    for line in page.read_text(encoding="utf-8").splitlines():
        if match := SNIPPET.match(line.strip()):
            text = (ROOT / match[1]).read_text(encoding="utf-8")
            section = text.split(f"--8<-- [start:{match[2]}] -->", 1)[1].split(f"--8<-- [end:{match[2]}]", 1)[0]
            lines += section.splitlines()
        else:
            lines.append(line)
    return lines


def plain(markdown: str) -> str:
    """The text a reader sees, roughly: links as their text, no emphasis or code marks, spaces collapsed."""
    return " ".join(re.sub(r"[`*_]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)).split())


def source_items(lines: list[str]) -> Iterator[tuple[bool, str]]:
    """(nested?, text) of every list item outside code fences."""
    fenced = False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := LIST_ITEM.match(line)):
            yield bool(match[1]), plain(match[2])


def html_page(site: Path, page: Path) -> Path:
    return site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")


def fence_problems(text: str, name: str) -> list[str]:
    """Every fence of the Markdown ``text`` (of the file ``name``) that is not a well-formed pair: a fence
    line with text after it (a closing fence followed by prose turns the code block and the paragraph into
    one paragraph), a fence of another kind, a closing fence indented unlike its opening, or a block never
    closed."""
    problems, opened = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not FENCE_LINE.match(line):
            continue
        where = f"{name}:{number}: {line.strip()[:60]!r}"
        if opened is None:
            match = OPENING_FENCE.match(line)
            if match is None:
                problems.append(f"{where}: an opening fence is ``` and a language, nothing else")
            else:
                opened = (number, match[1])
        elif (match := CLOSING_FENCE.match(line)) is None:
            problems.append(f"{where}: a closing fence has nothing after its ``` (the block opened on line "
                            f"{opened[0]})")
            opened = None
        elif match[1] != opened[1]:
            problems.append(f"{where}: indented unlike its opening fence (line {opened[0]})")
            opened = None
        else:
            opened = None
    if opened is not None:
        problems.append(f"{name}:{opened[0]}: a code block never closed (an odd number of fences)")
    return problems


def test_every_code_fence_is_well_formed() -> None:
    problems = [problem for page in SOURCES
                for problem in fence_problems(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))]
    assert not problems, "malformed code fences:\n" + "\n".join(problems)


@pytest.mark.timeout(120)
def test_the_pandas_prediction_example_renders_as_code(site: Path) -> None:
    page = article(site / "python-api" / "index.html")
    assert 'frame = pd.read_csv("penguins.csv")' in page.code
    assert "gives the metrics training reports" in page.prose and "metrics training" not in page.code


@pytest.mark.timeout(120)
def test_doc_paths_are_links(site: Path) -> None:
    """A page named by its path (``docs/torch.md``, as text or in backticks) is a link to it, on every page and
    on the home page, whose README parts link to ``docs/PAGE.md`` (docs/hooks/readme_links.py)."""
    pages = {page.stem for page in (ROOT / "docs").glob("*.md")}
    unlinked = []
    for html in sorted(site.rglob("*.html")):
        parser = UnlinkedPaths(pages)
        parser.feed(html.read_text(encoding="utf-8"))
        unlinked += [f"{html.parent.name or 'home'}: {path}" for path in parser.found]
    assert not unlinked, "doc paths written where a link is meant:\n" + "\n".join(unlinked)
    home = (site / "index.html").read_text(encoding="utf-8")
    for page in ("cluster", "torch", "prepare", "train"):
        assert f'href="{page}/"' in home, page  # the README's links, pointing at the site's pages


def test_fence_problems_are_found() -> None:
    """The check itself, on the faults it exists for."""
    cases = {"text after a closing fence": "```python\nx = 1\n``` and then prose\n",
             "an odd number of fences": "```python\nx = 1\n```\n\n```\nlast\n",
             "a closing fence with a language": "```python\nx = 1\n```python\n",
             "tildes": "~~~\nx\n~~~\n",
             "a closing fence indented differently": "- item\n\n    ```python\n    x = 1\n```\n"}
    for name, text in cases.items():
        assert fence_problems(text, "case.md"), name
    assert not fence_problems("- item\n\n    ```python\n    x = 1\n    ```\n\n```\nout\n```\n", "fine.md")


@pytest.mark.timeout(120)
def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "formats" / "index.html").exists()
    api = (site / "api" / "index.html").read_text()
    assert "open_dataset" in api and "load_model" in api  # the reference was generated from the docstrings
    home = (site / "index.html").read_text()
    assert "penguins.csv" in home  # the README's tour, included by pymdownx.snippets


@pytest.mark.timeout(120)
def test_every_markdown_list_renders_as_a_list(site: Path) -> None:
    missing = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        items = [(depth, plain(text)) for depth, text in article(html_page(site, page)).items]
        for nested, text in source_items(page_lines(page)):
            start = text[:30]
            if not any(html.startswith(start) and (depth > 1 or not nested) for depth, html in items):
                missing.append(f"{page.name}: {'nested ' if nested else ''}item {start!r}")
    assert not missing, ("list items not rendered as (nested) <li>; a list needs a blank line before it and "
                         "four spaces per nesting level:\n" + "\n".join(missing))


@pytest.mark.timeout(120)
def test_no_page_runs_a_list_into_a_paragraph(site: Path) -> None:
    """Also covers the API reference, whose lists come from docstrings."""
    run_on = [f"{html.parent.name or 'home'}: {text[:80]!r}" for html in sorted(site.rglob("*.html"))
              for text in article(html).paragraphs if RUN_ON_ITEM.search(text)]
    assert not run_on, "paragraphs holding list items:\n" + "\n".join(run_on)


@pytest.mark.timeout(120)
def test_docstring_examples_render_as_code_blocks(site: Path) -> None:
    html = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "doctest:" not in html
    api = article(site / "api" / "index.html")
    assert ">>>" not in api.prose  # every example line is inside a <pre>
    assert api.code.count(">>> ") >= 10
    assert '>>> ds = open_dataset("data/digits")\n>>> x, y = ds.split("train").read(0, 128)' in api.code


def test_the_torch_page_puts_the_users_steps_before_the_measurements() -> None:
    headings = [line[3:] for line in (ROOT / "docs" / "torch.md").read_text().splitlines() if line.startswith("## ")]
    steps = ["The job file", "Errors at start, not in workers", "Using the result"]
    measured = ["Zero-copy: how a worker binds the module", "Performance: memtrain vs DDP"]
    assert max(map(headings.index, steps)) < min(map(headings.index, measured)), headings
