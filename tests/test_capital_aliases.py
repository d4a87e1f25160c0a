"""The capitals verifier accepts the other spellings the data lists (``aliases``: Kiev for
Kyiv, Peking for Beijing, ...) and still refuses a reply that names another capital."""

from __future__ import annotations

import re
import unicodedata

from ludic_lab.data import capital_verifier, load_capitals


def _norm(t: str) -> str:
    t = unicodedata.normalize("NFKD", t).encode("ascii", "ignore").decode().lower()
    return " " + re.sub(r"[^a-z]+", " ", t).strip() + " "


def test_kiev_is_kyiv_and_the_other_listed_spellings_count() -> None:
    verify = capital_verifier()
    assert verify("Kiev", "Kyiv") and verify("The capital of Ukraine is Kiev.", "Kyiv")
    assert verify("Kyiv (Kiev)", "Kyiv")  # both spellings of one capital: not "several cities"
    assert verify("Peking", "Beijing") and verify("Ulan Bator", "Ulaanbaatar") and verify("Sana'a", "Sanaa")
    assert verify("Berne", "Bern") and verify("Nur-Sultan", "Astana") and verify("Ndjamena", "N'Djamena")
    assert verify("Kiev", "Kiev")  # an alias given as the target names the same capital
    for row in load_capitals("all"):
        for alias in row["aliases"]:
            assert verify(alias, row["answer"]) and verify(f"It is {alias}.", row["answer"]), (alias, row)


def test_aliases_do_not_open_a_loophole() -> None:
    verify = capital_verifier()
    assert not verify("Kiev or Moscow", "Kyiv")  # another capital named too
    assert not verify("Kiev", "Moscow") and not verify("Peking", "Tokyo")
    assert not verify("Kie", "Kyiv") and not verify("Kievan Rus", "Kyiv")  # whole words only


def test_the_alias_table_is_in_the_data_and_names_no_other_capital_or_country() -> None:
    rows = load_capitals("all")
    assert all(isinstance(r["aliases"], list) for r in rows)
    assert {r["answer"]: r["aliases"] for r in rows}["Kyiv"] == ["Kiev"]
    taken = {_norm(r["answer"]) for r in rows} | {_norm(r["country"]) for r in rows}
    for r in rows:
        for alias in r["aliases"]:
            assert _norm(alias) not in taken, f"alias {alias!r} of {r['answer']} is another name of the data set"


def test_rows_without_aliases_still_work() -> None:
    verify = capital_verifier([{"answer": "Paris"}, {"answer": "Berlin"}])
    assert verify("Paris", "Paris") and not verify("Paris or Berlin", "Paris") and not verify("Kiev", "Kyiv")
