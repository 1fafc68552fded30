"""Where each row's ORDER BY key of an ordered query is (`order_keys`), for comparing results
whose rows tied under that key may come in any order (see `toolenv_sql.reward`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from toolenv_sql.errors import SQLError
from toolenv_sql.guard import ordered_level, parse_read_query

__all__ = ["OrderKeys", "order_keys"]


@dataclass(frozen=True)
class OrderKeys:
    """How to read the ORDER BY key of each row of an ordered query (see `order_keys`)."""

    #: The query with the ORDER BY terms no output column holds selected after its own
    #: columns, without its OFFSET and with `past` more rows in its LIMIT (so rows tied past
    #: them show).
    sql: str
    #: Per ORDER BY term, the output column holding it (counted from the end of the query's own
    #: columns when negative: one after a `*`), or None: the next added column.
    terms: tuple[int | None, ...]
    offset: int
    limit: int | None

    def key(self, row: Sequence[Any], width: int) -> tuple[Any, ...]:
        """The ORDER BY key of a row of `sql`'s result whose first `width` columns are the query's own."""
        added = iter(range(width, len(row)))
        return tuple(row[next(added)] if j is None else row[j if j >= 0 else width + j] for j in self.terms)


def order_keys(sql: str, dialect: str, *, past: int = 1000) -> OrderKeys | None:
    """How to read each row's ORDER BY key of `sql`, or None when it is not ordered at its
    outermost level or its keys cannot be read safely.

    A term that is an output column's position (`ORDER BY 2`), alias, or expression is read
    from that column (in parentheses or under COLLATE too, as the engines read them); another
    expression is selected too, except under DISTINCT (where a new column would change the
    rows) or in UNION/INTERSECT/EXCEPT. LIMIT and OFFSET must be integer literals, and a name
    given to several output columns is not read outside SQLite (DuckDB sorts by the last). The
    query is not given where sqlglot's rendering of it does not parse back as the same query.

    The query reads `past` rows past the LIMIT (all of them without one): a LIMIT it keeps lets
    the engine keep only its top rows rather than sort the whole result.
    """
    tree = ordered_level(sql, dialect)
    if tree is None or not isinstance(tree, (exp.Select, exp.SetOperation)):
        return None
    order = tree.args["order"]
    bounds = _literal_bound(tree.args.get("offset")), _literal_bound(tree.args.get("limit"))
    if -1 in bounds:
        return None
    terms: list[int | None] = []
    added: list[exp.Expr] = []
    for ordered in order.expressions:
        term = _bare(ordered.this)
        if dialect != "sqlite" and _names_several(term, tree.selects):
            return None
        column = _output_column(term, tree.selects, dialect)
        if column is None:
            if not isinstance(tree, exp.Select) or tree.args.get("distinct") is not None:
                return None
            if _means_otherwise_selected(term, tree.selects):
                return None
            added.append(ordered.this)
        terms.append(column)
    tree = tree.copy()
    for i, term in enumerate(added):
        tree.select(exp.alias_(term.copy(), f"_toolenv_order_key_{i}"), append=True, copy=False)
    offset, limit = bounds
    tree.set("offset", None)
    if limit is not None:
        tree.set("limit", exp.Limit(expression=exp.Literal.number((offset or 0) + limit + past)))
    text = tree.sql(dialect=dialect)
    if not _renders_as_parsed(text, tree, dialect):
        return None
    return OrderKeys(text, tuple(terms), offset or 0, limit)


def _renders_as_parsed(text: str, tree: exp.Expr, dialect: str) -> bool:
    """`text`, sqlglot's rendering of `tree`, parses back to `tree`: where it does not, the
    rendering may mean something else, such as SQLite's CAST(x AS DATE) (a number) rendered
    DATE(x) (a date, or NULL), a coarser key that would tie rows the engine sorts apart."""
    try:
        return parse_read_query(text, dialect) == tree
    except SQLError:
        return False


def _literal_bound(node: exp.Expr | None) -> int | None:
    """A LIMIT's or OFFSET's count; None when there is none, -1 when it is not a literal count."""
    if node is None:
        return None
    value = node.args.get("expression")
    others = [k for k, v in node.args.items() if v and k != "expression"]  # LIMIT 10 PERCENT, WITH TIES, …
    if not isinstance(value, exp.Literal) or not value.is_int or others:
        return -1
    return int(value.this)


def _bare(term: exp.Expr) -> exp.Expr:
    """An ORDER BY term without the parentheses and COLLATE around it: both engines read
    `(2)` and `2 COLLATE NOCASE` as position 2, and `(name)` as the alias `name` (a key read
    without its collation is only finer: it ties fewer rows)."""
    while isinstance(term, (exp.Paren, exp.Collate)):
        term = term.this
    return term


def _names_several(term: exp.Expr, selects: list[exp.Expr]) -> bool:
    """`term` is a bare name that several output columns are given (`SELECT a AS k, b AS k`)."""
    if not isinstance(term, exp.Column) or term.table:
        return False
    name = term.name.lower()
    return sum(isinstance(s, exp.Alias) and s.alias.lower() == name for s in selects) > 1


def _means_otherwise_selected(term: exp.Expr, selects: list[exp.Expr]) -> bool:
    """`term` holds a bare name an output column is given. Selected, it would not mean that
    column: SQLite's ORDER BY reads an alias inside an expression (where no table has the
    name), its select list does not (a double-quoted name is then the string itself);
    DuckDB's `#2` is likewise the 2nd output column in ORDER BY, a table's column selected."""
    aliases = {s.alias.lower() for s in selects if isinstance(s, exp.Alias)}
    if term.find(exp.PositionalColumn) is not None:
        return True
    return any(not c.table and c.name.lower() in aliases for c in term.find_all(exp.Column))


def _one_column(select: exp.Expr) -> bool:
    """`select` gives one output column (`*`, `t.*`, DuckDB's COLUMNS(…) and UNNEST may give several)."""
    node = select.unalias()
    if isinstance(node, (exp.Star, exp.Explode, exp.Unnest)) or node.find(exp.Columns) is not None:
        return False
    return not (isinstance(node, exp.Column) and isinstance(node.this, exp.Star))


def _output_column(term: exp.Expr, selects: list[exp.Expr], dialect: str) -> int | None:
    """The output column an ORDER BY term names: by position, by alias (a bare name, which the
    engines read as the alias first), or as the same expression; negative when counted from the
    last column (a select after a `*`, whose own columns are not counted here), None when the
    column is not known (between two `*`s, or an alias after a `*` in SQLite, which reads a
    column of the `*` so named first)."""
    if isinstance(term, exp.PositionalColumn):  # DuckDB's `ORDER BY #2`: as `ORDER BY 2`
        term = term.this
    if isinstance(term, exp.Literal) and term.is_int:
        position = int(term.this) - 1
        return position if position >= 0 else None
    j = None
    if isinstance(term, exp.Column) and not term.table:
        j = next(
            (j for j, s in enumerate(selects) if isinstance(s, exp.Alias) and s.alias.lower() == term.name.lower()),
            None,
        )
        if j is not None and dialect == "sqlite" and not all(_one_column(s) for s in selects[:j]):
            return None
    if j is None:
        j = next((j for j, s in enumerate(selects) if _one_column(s) and s.unalias() == term), None)
    if j is None:
        return None
    if all(_one_column(s) for s in selects[:j]):
        return j
    if all(_one_column(s) for s in selects[j:]):
        return j - len(selects)
    return None
