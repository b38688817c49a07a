# The two commands of the README. Both set everything up from nothing first.
.PHONY: setup demo test lint down

setup:
	bash infra/setup.sh

# Until the multi-tenant demo lands: start the local broker and run an event round trip.
demo: setup
	.venv/bin/joynexus broker up
	.venv/bin/joynexus roundtrip

# The whole suite; it starts its own broker on free ports and stops it at the end.
test: setup
	.venv/bin/ruff check .
	.venv/bin/python -m pytest

lint:
	.venv/bin/ruff check .

down:
	.venv/bin/joynexus broker down
