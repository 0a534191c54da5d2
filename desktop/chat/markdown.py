"""Split a chat reply into Markdown text and fenced code blocks.

Text parts are shown with Qt's Markdown renderer; code blocks get their own monospace view with
a Copy button. An unterminated fence (a reply still streaming) is a code block to the end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE_RE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$")


@dataclass(frozen=True)
class Block:
    kind: str  # "text" | "code"
    text: str
    language: str = ""
    closed: bool = True  # False: a code block whose closing fence has not arrived yet


def split_blocks(source: str) -> tuple[Block, ...]:
    blocks: list[Block] = []
    text: list[str] = []
    code: list[str] = []
    fence = ""
    language = ""
    for line in source.split("\n"):
        if not fence:
            m = _FENCE_RE.match(line)
            if m is None:
                text.append(line)
                continue
            if "".join(text).strip():
                blocks.append(Block("text", "\n".join(text).strip("\n")))
            text = []
            fence, language = m.group(1), m.group(2)
            continue
        stripped = line.strip()
        if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
            blocks.append(Block("code", "\n".join(code), language))
            code, fence, language = [], "", ""
            continue
        code.append(line)
    if fence:
        blocks.append(Block("code", "\n".join(code), language, closed=False))
    elif "".join(text).strip():
        blocks.append(Block("text", "\n".join(text).strip("\n")))
    return tuple(blocks)
