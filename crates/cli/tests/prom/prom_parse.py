#!/usr/bin/env python3
"""Parses a Prometheus text exposition from stdin with prometheus_client's own parser
(text_string_to_metric_families) and prints it as JSON: {"family": {"type": T, "help": H,
"samples": [[name, {labels}, value], ...]}}. Exits 3 with a message when prometheus_client is
not installed (scripts/setup.sh installs python3-prometheus-client), 1 when the text does not
parse."""
import json
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    sys.stderr.write(
        f"prometheus_client is not installed ({e}); run scripts/setup.sh "
        "(apt-get install python3-prometheus-client)\n")
    sys.exit(3)

text = sys.stdin.read()
out = {}
try:
    for fam in text_string_to_metric_families(text):
        out[fam.name] = {
            "type": fam.type,
            "help": fam.documentation,
            "samples": [[s.name, s.labels, s.value] for s in fam.samples],
        }
except Exception as e:  # the parser raises ValueError and others on bad input
    sys.stderr.write(f"not valid exposition text: {e!r}\n")
    sys.exit(1)
json.dump(out, sys.stdout)
