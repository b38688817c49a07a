"""``python -m infra`` is the ``joynexus`` command."""

from infra.cli import app

app(prog_name="joynexus")
