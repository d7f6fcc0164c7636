"""The catalogue the gateway serves and every service follows (ADR-0111)."""
