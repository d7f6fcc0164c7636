"""``python -m dispo.libs.cli``: the ``dispo`` command (how ``dispo up --detach`` starts it)."""

from dispo.libs.cli.main import main

main()
