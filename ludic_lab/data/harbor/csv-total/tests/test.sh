#!/bin/bash
# Two checks, each its own reward key; "reward" is 1 when both pass (Harbor reads reward.json first).
exists=0
correct=0
if [ -f /srv/report/total.txt ]; then
  exists=1
  if [ "$(tr -d '[:space:]' < /srv/report/total.txt)" = "168.10" ]; then
    correct=1
  fi
fi
echo "{\"reward\": $((exists * correct)), \"file_exists\": $exists, \"value_correct\": $correct}" > /logs/verifier/reward.json
