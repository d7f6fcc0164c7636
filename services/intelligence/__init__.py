"""The intelligence service."""
