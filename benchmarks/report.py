"""Where benchmark results go: JSON under results/, a markdown table beside the script."""

from __future__ import annotations

import json
import time
from pathlib import Path

HERE = Path(__file__).parent


def save(name: str, results: dict, title: str, command: str, body: list[str],
         machine: str = "2-core x86_64, no GPU") -> None:
    out = HERE / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    (HERE / f"{name}.md").write_text(
        f"# {title}\n\nCommand: `{command}` ({time.strftime('%Y-%m-%d')}, {machine}).\n\n"
        + "\n".join(body) + "\n")
