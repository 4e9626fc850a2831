"""mkdocs hooks (mkdocs.yml ``hooks:``): the decision records join the nav by themselves.

Each ``docs/decisions/NNNN-title.md`` is listed under Design > Decisions, in number order,
titled by its first heading: a new record needs no edit of mkdocs.yml, and ``--strict``
(which fails on a page left out of the nav) still holds for every other page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_config(config: Any) -> Any:
    records = sorted((Path(config["docs_dir"]) / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md"))
    for section in config["nav"] or []:
        if isinstance(section, dict) and isinstance(section.get("Design"), list):
            design = [item for item in section["Design"] if not (isinstance(item, dict) and "Decisions" in item)]
            if records:
                design.append({"Decisions": [f"decisions/{r.name}" for r in records]})
            section["Design"] = design
    return config
