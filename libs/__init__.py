"""Shared building blocks of every Dispo service."""
