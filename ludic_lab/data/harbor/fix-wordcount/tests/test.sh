#!/bin/bash
# Runs from the working directory (/app): the checks in test_outputs.py, one JUnit report.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
if python -m pytest -q -p no:cacheprovider --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
