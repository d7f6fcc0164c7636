"""Bulk actions on tasks by filter (ADR-0112)."""
