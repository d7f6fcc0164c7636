from pipeline_fixtures import catalogue_file, client, downstream, pipeline  # noqa: F401
