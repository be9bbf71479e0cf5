"""TSV field rules shared by passages.tsv and *.qa.tsv.

Files are split on tab only (no CSV quoting), so texts with quotes survive untouched. One exception
keeps DPR's own published files readable: DPR wrote psgs_w100.tsv and *.qa.csv with Python's csv
module, which wraps a field in double quotes and doubles inner quotes (``"Aaron ( ""Ahärôn"") ..."``).
A field is taken as csv-quoted exactly when it starts and ends with ``"`` and every inner quote is
doubled; the writer quotes a field exactly when the reader would otherwise strip its quotes, so our
own round trips are exact.
"""

from __future__ import annotations

import re

_WS_BREAK = re.compile(r"[\t\r\n]")


def _looks_quoted(field: str) -> bool:
    if len(field) < 2 or field[0] != '"' or field[-1] != '"':
        return False
    return '"' not in field[1:-1].replace('""', "")


def unquote_field(field: str) -> str:
    """Undo csv quoting if (and only if) the field is csv-quoted; see the module docstring."""
    if _looks_quoted(field):
        return field[1:-1].replace('""', '"')
    return field


def clean_field(text: str) -> str:
    """Replace tabs and line breaks by a space, then csv-quote if the reader would unquote it.

    Replacing (rather than rejecting) is deliberate: a line break inside a passage or question carries
    no meaning for retrieval (tokenizers treat it as a space), and DPR's own files contain none.
    """
    text = _WS_BREAK.sub(" ", text)
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return '"' + text.replace('"', '""') + '"'
    return text
