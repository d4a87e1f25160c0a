#!/bin/bash
python3 -c '
import csv
with open("/srv/report/sales.csv", newline="") as f:
    total = sum(float(row["amount"]) for row in csv.DictReader(f))
print(f"{total:.2f}")
' > /srv/report/total.txt
