#!/bin/bash
# GREETING comes from the image (Dockerfile ENV), SECOND_NAME from task.toml [verifier.env].
first=0
second=0
[ "$(bash /workspace/greet.sh Ada 2>/dev/null)" = "Hola, Ada!" ] && first=1
[ "$(GREETING=Hi bash /workspace/greet.sh "$SECOND_NAME" 2>/dev/null)" = "Hi, Grace!" ] && second=1
echo "{\"reward\": $((first * second)), \"image_greeting\": $first, \"other_greeting\": $second}" > /logs/verifier/reward.json
