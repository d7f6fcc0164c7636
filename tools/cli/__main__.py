"""``python -m dispo.tools.cli``: the ``dispo`` command (how ``dispo up --detach`` starts it)."""

from dispo.tools.cli.main import main

main()
