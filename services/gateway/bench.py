"""``python -m dispo.gateway.bench`` is ``dispo bench submit`` (:mod:`dispo.tools.bench.run`)."""

from dispo.tools.bench.run import main

if __name__ == "__main__":
    main()
