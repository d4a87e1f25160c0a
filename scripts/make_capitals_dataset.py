"""Write ``ludic_lab/data/capitals.jsonl``: countries and their capital cities (offline).

Deterministic: every fifth country (in this list's order) goes to the test split.
Run: ``python scripts/make_capitals_dataset.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

CAPITALS = [
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Portugal", "Lisbon"),
    ("United Kingdom", "London"),
    ("Ireland", "Dublin"),
    ("Belgium", "Brussels"),
    ("Netherlands", "Amsterdam"),
    ("Luxembourg", "Luxembourg"),
    ("Switzerland", "Bern"),
    ("Austria", "Vienna"),
    ("Poland", "Warsaw"),
    ("Czech Republic", "Prague"),
    ("Slovakia", "Bratislava"),
    ("Hungary", "Budapest"),
    ("Romania", "Bucharest"),
    ("Bulgaria", "Sofia"),
    ("Greece", "Athens"),
    ("Serbia", "Belgrade"),
    ("Croatia", "Zagreb"),
    ("Slovenia", "Ljubljana"),
    ("Bosnia and Herzegovina", "Sarajevo"),
    ("Albania", "Tirana"),
    ("North Macedonia", "Skopje"),
    ("Montenegro", "Podgorica"),
    ("Denmark", "Copenhagen"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"),
    ("Iceland", "Reykjavik"),
    ("Estonia", "Tallinn"),
    ("Latvia", "Riga"),
    ("Lithuania", "Vilnius"),
    ("Belarus", "Minsk"),
    ("Ukraine", "Kyiv"),
    ("Moldova", "Chisinau"),
    ("Russia", "Moscow"),
    ("Turkey", "Ankara"),
    ("Cyprus", "Nicosia"),
    ("Malta", "Valletta"),
    ("Georgia", "Tbilisi"),
    ("Armenia", "Yerevan"),
    ("Azerbaijan", "Baku"),
    ("Kazakhstan", "Astana"),
    ("Uzbekistan", "Tashkent"),
    ("Turkmenistan", "Ashgabat"),
    ("Kyrgyzstan", "Bishkek"),
    ("Tajikistan", "Dushanbe"),
    ("Afghanistan", "Kabul"),
    ("Pakistan", "Islamabad"),
    ("India", "New Delhi"),
    ("Nepal", "Kathmandu"),
    ("Bangladesh", "Dhaka"),
    ("Sri Lanka", "Colombo"),
    ("China", "Beijing"),
    ("Mongolia", "Ulaanbaatar"),
    ("Japan", "Tokyo"),
    ("South Korea", "Seoul"),
    ("North Korea", "Pyongyang"),
    ("Taiwan", "Taipei"),
    ("Vietnam", "Hanoi"),
    ("Laos", "Vientiane"),
    ("Cambodia", "Phnom Penh"),
    ("Thailand", "Bangkok"),
    ("Malaysia", "Kuala Lumpur"),
    ("Singapore", "Singapore"),
    ("Indonesia", "Jakarta"),
    ("Philippines", "Manila"),
    ("Iran", "Tehran"),
    ("Iraq", "Baghdad"),
    ("Syria", "Damascus"),
    ("Lebanon", "Beirut"),
    ("Jordan", "Amman"),
    ("Israel", "Jerusalem"),
    ("Saudi Arabia", "Riyadh"),
    ("Yemen", "Sanaa"),
    ("Oman", "Muscat"),
    ("United Arab Emirates", "Abu Dhabi"),
    ("Qatar", "Doha"),
    ("Kuwait", "Kuwait City"),
    ("Egypt", "Cairo"),
    ("Libya", "Tripoli"),
    ("Tunisia", "Tunis"),
    ("Algeria", "Algiers"),
    ("Morocco", "Rabat"),
    ("Sudan", "Khartoum"),
    ("Ethiopia", "Addis Ababa"),
    ("Kenya", "Nairobi"),
    ("Uganda", "Kampala"),
    ("Tanzania", "Dodoma"),
    ("Rwanda", "Kigali"),
    ("Somalia", "Mogadishu"),
    ("Nigeria", "Abuja"),
    ("Ghana", "Accra"),
    ("Senegal", "Dakar"),
    ("Mali", "Bamako"),
    ("Niger", "Niamey"),
    ("Chad", "N'Djamena"),
    ("Cameroon", "Yaounde"),
    ("Angola", "Luanda"),
    ("Zambia", "Lusaka"),
    ("Zimbabwe", "Harare"),
    ("Mozambique", "Maputo"),
    ("Madagascar", "Antananarivo"),
    ("Namibia", "Windhoek"),
    ("Botswana", "Gaborone"),
    ("United States", "Washington"),
    ("Canada", "Ottawa"),
    ("Mexico", "Mexico City"),
    ("Cuba", "Havana"),
    ("Jamaica", "Kingston"),
    ("Guatemala", "Guatemala City"),
    ("Honduras", "Tegucigalpa"),
    ("Nicaragua", "Managua"),
    ("Costa Rica", "San Jose"),
    ("Panama", "Panama City"),
    ("Colombia", "Bogota"),
    ("Venezuela", "Caracas"),
    ("Ecuador", "Quito"),
    ("Peru", "Lima"),
    ("Bolivia", "La Paz"),
    ("Chile", "Santiago"),
    ("Argentina", "Buenos Aires"),
    ("Uruguay", "Montevideo"),
    ("Paraguay", "Asuncion"),
    ("Brazil", "Brasilia"),
    ("Australia", "Canberra"),
    ("New Zealand", "Wellington"),
    ("Fiji", "Suva"),
    ("Papua New Guinea", "Port Moresby"),
]

ALIASES = {
    "Kyiv": ["Kiev"],
    "Beijing": ["Peking"],
    "Bern": ["Berne"],
    "Chisinau": ["Kishinev"],
    "Tallinn": ["Tallin"],
    "Astana": ["Nur-Sultan"],
    "Ashgabat": ["Ashkhabad"],
    "Kathmandu": ["Katmandu"],
    "Dhaka": ["Dacca"],
    "Ulaanbaatar": ["Ulan Bator"],
    "Hanoi": ["Ha Noi"],
    "Tehran": ["Teheran"],
    "Sanaa": ["Sana'a"],
    "N'Djamena": ["Ndjamena"],
}
"""Other spellings of a capital that a reply may use: transliterations (Kiev, Peking, Ulan
Bator) and a former name (Nur-Sultan). Accents, case and punctuation inside a name need no
entry (the verifier ignores them); an entry must not be another capital's or a country's name."""

OUT = Path(__file__).resolve().parents[1] / "ludic_lab" / "data" / "capitals.jsonl"


def rows() -> list[dict]:
    return [
        {
            "id": f"cap-{i:03d}",
            "country": country,
            "question": f"What is the capital of {country}?",
            "answer": capital,
            "aliases": ALIASES.get(capital, []),
            "split": "test" if i % 5 == 4 else "train",
        }
        for i, (country, capital) in enumerate(CAPITALS)
    ]


def main() -> None:
    unknown = set(ALIASES) - {capital for _, capital in CAPITALS}
    assert not unknown, f"ALIASES names capitals the data set does not have: {sorted(unknown)}"
    with OUT.open("w", encoding="utf-8") as f:
        for r in rows():
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(CAPITALS)} rows to {OUT}")


if __name__ == "__main__":
    main()
