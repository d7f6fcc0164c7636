"""``python -m dispo.gateway.bench`` is ``dispo bench submit`` (:mod:`dispo.libs.bench.run`)."""

from dispo.libs.bench.run import main

if __name__ == "__main__":
    main()
