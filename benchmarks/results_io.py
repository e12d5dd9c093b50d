"""Writing a benchmark's results: ``<name>.json`` and ``<name>.md`` side by side."""

from __future__ import annotations

import json
from pathlib import Path


def write_json_and_markdown(out: str | Path, name: str, result: dict, markdown: str) -> None:
    """Write ``result`` to ``<out>/<name>.json`` and ``markdown`` to ``<out>/<name>.md``
    (creating ``out``), then print the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text(markdown)
    print(markdown)
