"""Generated from protos/ by `python -m dispo.libs.protogen`. Do not edit."""
