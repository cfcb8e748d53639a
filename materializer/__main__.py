"""``python -m materializer``: the same CLI as the ``materializer`` command."""

from materializer.cli import app

app()
