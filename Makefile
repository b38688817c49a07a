# The two commands of the README. Both set everything up from nothing first.
.PHONY: setup demo test lint down gpu-bundle

setup:
	bash infra/setup.sh

# The paper's scenario (3 RL + 1 SFT tenants on one backbone, then evaluations), smoke-test sized,
# on the tiny preset unless JOYNEXUS_BACKBONE says otherwise. `joynexus demo` is the full-size run.
demo: setup
	JOYNEXUS_BACKBONE=$${JOYNEXUS_BACKBONE:-tiny} .venv/bin/joynexus demo --quick

# The whole suite; it starts its own broker on free ports and stops it at the end.
test: setup
	.venv/bin/ruff check .
	.venv/bin/python -m pytest

lint:
	.venv/bin/ruff check .

down:
	.venv/bin/joynexus broker down

# What benchmarks/gpu.sh --bundle needs on a GPU machine without network or Java (.gpu-bundle/).
gpu-bundle: setup
	.venv/bin/python -m benchmarks.gpu_bundle
