"""The README's links to ``docs/PAGE.md``, where the site includes README sections, point at ``PAGE.md``.

docs/index.md takes parts of README.md through pymdownx.snippets. On GitHub the README sits at the
repository's root, so its links name ``docs/torch.md``; on the site the same text is part of docs/index.md,
where that link would be ``docs/docs/torch.md``, a page that does not exist (``mkdocs build --strict``
fails). This mkdocs hook (mkdocs.yml ``hooks``) adds a Markdown preprocessor that runs after the snippets
are put in place and rewrites every relative link to ``docs/...`` as one to the page itself, so one README
text is right in both places.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

README_LINK = re.compile(r"\]\(docs/")  # [text](docs/torch.md#anchor): a link from the repository's root
AFTER_SNIPPETS = 30  # pymdownx.snippets runs at priority 32; a lower priority runs after it


class ReadmeLinks(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return [README_LINK.sub("](", line) for line in lines]


class ReadmeLinksExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 - Markdown's name
        md.preprocessors.register(ReadmeLinks(md), "readme_links", AFTER_SNIPPETS)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(ReadmeLinksExtension())
    return config
