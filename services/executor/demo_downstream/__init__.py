"""A small HTTP service standing in for the downstream systems (labels, reviews,
notifications) of the example catalogue. See :mod:`dispo.executor.demo_downstream.app`."""
