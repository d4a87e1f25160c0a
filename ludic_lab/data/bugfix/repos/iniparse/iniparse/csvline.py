"""One CSV line <-> its fields (double quotes, doubled quotes inside quotes)."""


def split_csv_line(line: str, sep: str = ",") -> list[str]:
    """The fields of ``line``; a field in double quotes may hold ``sep`` and ``""`` (one quote)."""
    fields: list[str] = []
    field = ""
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"' and i + 1 < len(line) and line[i + 1] == '"':
                field += '"'
                i += 1
            elif ch == '"':
                in_quotes = False
            else:
                field += ch
        elif ch == '"':
            in_quotes = True
        elif ch == sep:
            fields.append(field)
            field = ""
        else:
            field += ch
        i += 1
    if in_quotes:
        raise ValueError("unterminated quoted field")
    fields.append(field)
    return fields


def join_csv_line(fields: list[str], sep: str = ",") -> str:
    """One line holding ``fields``; a field with ``sep``, a quote or a space at either end is quoted."""
    out = []
    for field in fields:
        needs_quotes = sep in field or '"' in field or field != field.strip()
        if needs_quotes:
            field = '"' + field.replace('"', '""') + '"'
        out.append(field)
    return sep.join(out)
