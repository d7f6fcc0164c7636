from pipeline_fixtures import catalogue_file, client, downstream, gateway_client, gateway_only, pipeline  # noqa: F401
