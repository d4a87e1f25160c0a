"""A tiny INI reader/writer and a CSV line splitter."""

from iniparse.csvline import join_csv_line, split_csv_line
from iniparse.ini import ParseError, dump_ini, get_bool, parse_ini

__all__ = ["ParseError", "dump_ini", "get_bool", "join_csv_line", "parse_ini", "split_csv_line"]
