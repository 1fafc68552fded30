"""sqlglot's syntax errors in plain words: what is wrong, near which token, at which line and column.

sqlglot's messages name its own classes and tokens ("Required keyword: 'expression' missing
for <class '...GT'>"), which tell a model nothing; its error fields (description, highlight,
line, col) hold what a short message needs.
"""

from __future__ import annotations

import re
from typing import Any

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError

__all__ = ["clip", "parse_problem", "token_problem"]

_CLASS = re.compile(r"<class '(?:\w+\.)*(\w+)'>")
_TOKEN = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: \d+, col: \d+.*?>", re.DOTALL)
_MISSING = re.compile(r"Missing (.+?) from (\d+):(\d+)")


def clip(text: str, limit: int = 40) -> str:
    """`text` on one line, at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_problem(exc: ParseError) -> str:
    """sqlglot's first parse error as "what is wrong near which token (line, column)"."""
    if not exc.errors:
        return clip(_CLASS.sub(r"\1", str(exc)).splitlines()[0] if str(exc) else "cannot parse the query", 200)
    err: dict[str, Any] = exc.errors[0]
    description = str(err.get("description") or "cannot parse the query")
    near = clip(str(err.get("highlight") or ""))
    ends = not str(err.get("end_context") or "").strip()
    where = f"near '{near}'" if near else "here"
    if description.startswith("Required keyword:"):
        problem = f"incomplete expression {where}"
    elif description.startswith("Invalid expression / Unexpected token"):
        problem = f"unexpected '{near}'" if near else "unexpected token"
    else:
        token = _TOKEN.search(description)
        if token is not None:
            got = "the query ends there" if token.group(1) == "SENTINEL" else f"got '{clip(token.group(2))}'"
            head = description[: token.start()].removesuffix(" but got ").strip()
            problem = f"{head[:1].lower()}{head[1:]} after '{near}', but {got}" if near else f"{head}, but {got}"
        else:
            text = clip(_CLASS.sub(r"\1", description), 160)
            text = re.sub(r"^Expect(?:ing|ed) ", "expected ", text)
            text = re.sub(r"^expected (\W)$", r"expected '\1'", text)  # "Expecting )"
            problem = f"{text[:1].lower()}{text[1:]} {where}"
            if ends and text.startswith("expected "):
                problem += " (the query ends there)"
    line, col = err.get("line"), err.get("col")
    if isinstance(line, int) and isinstance(col, int):
        highlight = str(err.get("highlight") or "")
        if highlight and "\n" not in highlight and col >= len(highlight):
            col -= len(highlight) - 1  # sqlglot gives the column of the token's last character
        problem += f" (line {line}, column {col})"
    return problem


def token_problem(exc: TokenError, sql: str, reader: Dialect) -> str:
    """What the tokenizer could not read: an unclosed string, quoted name or comment, as a short message."""
    inner = exc.__cause__ or exc.__context__
    found = _MISSING.search(str(inner)) if isinstance(inner, TokenError) else None
    if found is None:
        if isinstance(inner, TokenError) and "Numeric string" in str(inner):
            return "a hex or bit string holds invalid characters"
        return "cannot read the query: look for an unclosed quote or /* comment"
    closer, line, offset = found.group(1), int(found.group(2)), int(found.group(3))
    column = offset - (sql.rfind("\n", 0, offset) + 1) + 1
    tokenizer = reader.tokenizer_class
    names = {i if isinstance(i, str) else i[1] for i in getattr(tokenizer, "IDENTIFIERS", ())}
    quotes = {q if isinstance(q, str) else q[1] for q in getattr(tokenizer, "QUOTES", ())}
    if closer in names and closer not in quotes:
        what = "quoted name"
    elif closer in names:
        what = "string literal or quoted name"
    else:
        what = "string literal"
    start = clip(sql[offset:], 30)
    return f"unterminated {what} (no closing {closer}) starting at line {line}, column {column}: {start}"
